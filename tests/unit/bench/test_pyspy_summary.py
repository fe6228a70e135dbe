"""perf/pyspy_summary.py: a stub's serving stacks, start-up left out, read as shares."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "perf" / "pyspy_summary.py"
spec = importlib.util.spec_from_file_location("pyspy_summary", SCRIPT)
assert spec and spec.loader
pyspy_summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pyspy_summary)

REPO = SCRIPT.parents[1]

RAW = f"""\
run (threading.py:982);_run_jobs ({REPO}/tritonforge/serving/runtime.py:625);send (x.py:1) 3
run (threading.py:982);_run_jobs ({REPO}/tritonforge/serving/runtime.py:625) 1
run (threading.py:982);_step (s.py:9) 4
start (m.py:1);_find_and_load (<frozen importlib._bootstrap>:1176);exec (t.py:3) 90
"""


def test_start_up_stacks_are_left_out_and_paths_made_relative(tmp_path: Path) -> None:
    raw = tmp_path / "stub.raw"
    raw.write_text(RAW)
    stacks = pyspy_summary.serving_stacks(raw)
    assert sum(stacks.values()) == 8  # the 90 import samples are start-up
    assert all(str(REPO) not in stack for stack in stacks)
    assert "run (threading.py:982);_step (s.py:9)" in stacks


def test_shares_are_of_the_serving_samples(tmp_path: Path) -> None:
    raw = tmp_path / "stub.raw"
    raw.write_text(RAW)
    text = pyspy_summary.summary(pyspy_summary.serving_stacks(raw), top=10)
    assert text.startswith("samples: 8\n")
    own, under = text.split("samples under (inclusive):")
    assert " 50.0 %  _step (s.py:9)" in own  # 4 of 8 samples in the step itself
    assert " 37.5 %  send (x.py:1)" in own
    assert " 50.0 %  _run_jobs (tritonforge/serving/runtime.py:625)" in under
    assert "100.0 %  run (threading.py:982)" in under
