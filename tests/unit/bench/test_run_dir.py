"""Every tool's run folder is named by its UTC start time, so runs sort by time."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from tritonforge.paths import new_run_dir


def test_a_run_folder_is_its_utc_start_time_and_exists(tmp_path: Path) -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    run_dir = new_run_dir(tmp_path / "kind")
    assert run_dir.is_dir() and run_dir.parent == tmp_path / "kind"
    assert re.fullmatch(r"\d{8}T\d{6}Z", run_dir.name)
    started = datetime.strptime(run_dir.name, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    assert before <= started <= datetime.now(UTC)
