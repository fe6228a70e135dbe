"""Logs kept with a result name places relative to the repository, not this machine's."""

from __future__ import annotations

import sysconfig
import tempfile
from pathlib import Path

from tritonforge.paths import REPO_ROOT, machine_free, make_machine_free


def test_repository_and_temporary_paths_are_named_without_this_machine() -> None:
    line = (
        f"loaded {REPO_ROOT}/.cache/models/m/tokenizer.json from "
        f"{tempfile.gettempdir()}/tritonforge-ceiling-x/repository"
    )
    assert machine_free(line) == (
        "loaded .cache/models/m/tokenizer.json from <tmp>/tritonforge-ceiling-x/repository"
    )
    warning = f"{sysconfig.get_paths()['stdlib']}/multiprocessing/resource_tracker.py:254"
    assert machine_free(warning) == "<stdlib>/multiprocessing/resource_tracker.py:254"
    elsewhere = "/srv/models/m/tokenizer.json"  # no path of this machine's in it
    assert machine_free(elsewhere) == elsewhere


def test_a_run_folder_is_rewritten_in_place(tmp_path: Path) -> None:
    log = tmp_path / "tritonserver.log"
    log.write_text(f"backend-directory {REPO_ROOT}/.cache/backends\n")
    make_machine_free(tmp_path)
    assert log.read_text() == "backend-directory .cache/backends\n"
