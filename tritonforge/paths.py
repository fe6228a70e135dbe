"""Where this checkout keeps things: every module that needs a repository path asks here.

The package is installed editable, so ``REPO_ROOT`` is the work tree the venv points at —
the tree whose code a server started from this venv really runs (its stubs import
``tritonforge`` from the same install).
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = Path(os.environ.get("TRITONFORGE_CACHE", REPO_ROOT / ".cache"))
MODEL_REPOSITORY = REPO_ROOT / "model_repository"
