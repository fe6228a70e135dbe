"""Where this checkout keeps things: every module that needs a repository path asks here.

The package is installed editable, so ``REPO_ROOT`` is the work tree the venv points at —
the tree whose code a server started from this venv really runs (its stubs import
``tritonforge`` from the same install).
"""

from __future__ import annotations

import os
import sysconfig
import tempfile
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


def machine_free(text: str) -> str:
    """``text`` with this machine's directories named as the repository's, ``<tmp>/``
    or ``<stdlib>/`` (the interpreter's library, named in Python's warnings).

    Logs kept with a result say where the server found its models and backends; a
    committed result names those places relative to the repository, not by this
    machine's absolute paths.
    """
    text = text.replace(str(REPO_ROOT) + "/", "").replace(tempfile.gettempdir(), "<tmp>")
    return text.replace(sysconfig.get_paths()["stdlib"], "<stdlib>")


def make_machine_free(folder: Path) -> None:
    """Rewrite every file in ``folder`` (a run's logs) with :func:`machine_free`."""
    for path in folder.iterdir():
        if path.is_file():
            text = path.read_text(errors="replace")
            path.write_text(machine_free(text))
