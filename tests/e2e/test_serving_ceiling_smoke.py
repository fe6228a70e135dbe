"""CI smoke of the serving-ceiling contract: every target, tiny counts, its own server.

The real tritonserver serves the Python floor, the unpaced synthetic engine and the
ensemble over it, with the OpenAI frontend in front; one round at concurrency 1 and 4,
32 tokens a request. Speed is never asserted (it is the contract's to report); what is
asserted is that every request of every target streamed every token it asked for,
counted as it arrived, and that the report and results were written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tritonforge.bench.ceiling import run_ceiling

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO / "perf" / "contracts" / "serving-ceiling.yaml"
TINY = [
    "load.concurrency=[1, 4]",
    "load.requests_per_level=4",
    "load.output_tokens=32",
    "load.warmup_requests=1",
    "load.rounds=1",
    "load.quiet_window_s=0",
    "load.max_duration_s=60",
    "targets.6.concurrency=[4]",  # the paced engine's target, which runs at high levels only
]


@pytest.mark.server
def test_serving_ceiling_contract_runs_every_target(tmp_path: Path) -> None:
    run_dir = run_ceiling(CONTRACT, TINY, tmp_path)
    results = json.loads((run_dir / "results.json").read_text())
    rows = results["rows"]
    assert {(r["target"], r["concurrency"]) for r in rows} == {
        (t["name"], c)
        for t in results["contract"]["targets"]
        for c in (1, 4)
        if t["concurrency"] is None or c in t["concurrency"]
    }
    assert ("grpc-paced-10ms", 4) in {(r["target"], r["concurrency"]) for r in rows}
    for row in rows:
        where = f"{row['target']} at {row['concurrency']}"
        assert row["errors"] == 0, f"{where}: {row['first_error']}"
        assert row["requests"] == 4 and row["tokens"] == 4 * 32, where
        assert row["tokens_per_response"] >= 1 and row["ttft_ms"]["p50"] > 0, where
        assert row["cpu_s"]["tritonserver"] >= 0, where
    roles = {role for r in rows for role in r["cpu_s"]}
    assert {"tritonserver", "frontend", "client", "stub:synthetic_unpaced"} <= roles
    report = (run_dir / "report.md").read_text()
    assert "## Concurrency 4" in report and "tokens/s ÷ floor" in report
