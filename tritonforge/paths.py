"""Where this checkout keeps things: every module that needs a repository path asks here.

The package is installed editable, so ``REPO_ROOT`` is the work tree the venv points at —
the tree whose code a server started from this venv really runs (its stubs import
``tritonforge`` from the same install).
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = Path(os.environ.get("TRITONFORGE_CACHE", REPO_ROOT / ".cache"))
MODEL_REPOSITORY = REPO_ROOT / "model_repository"


def new_run_dir(parent: Path) -> Path:
    """A run's results folder, ``parent/<UTC start time>`` (``20261202T161152Z``), created.

    Every tool names its runs this one way, so runs sort by time across tools and
    ``perf/README.md`` cites each by its folder; the folder's name is the run's stamp.
    """
    run_dir = parent / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir
