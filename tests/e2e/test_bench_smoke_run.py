"""CI smoke: the smoke contract end to end on the real servers, with tiny counts.

This keeps the runner honest — real tritonserver with vllm_model, vLLM's own OpenAI
server, the offline engine, aiperf from .venv-bench — without judging any speed
(targets are recorded in reports, never asserted); what it does assert is that every
target delivered every token it was forced to produce, counted as it arrived. It starts
and stops its own servers on free ports; about 3-4 minutes on two cores.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import psutil
import pytest

from tritonforge.bench.environment import ISA_FLAGS
from tritonforge.bench.runner import run_contract
from tritonforge.bench.tools import BENCH_VENV

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "load.concurrency=[1, 2]",
    "load.requests_per_level=3",
    "load.warmup_requests=0",  # warm-up is exercised by `make bench`; CI keeps to ~3 min
    "load.rounds=1",  # rounds are exercised by `make bench` and unit-tested; CI keeps to one
    "load.max_duration_s=90",
    # Short prompts: a bf16 prefill costs ~22 ms a token on a 2-core AVX2 host; the
    # structured class keeps the shortest its instruction and shared prefix fit in.
    "traffic.classes.0.input_tokens={dist: fixed, value: 24}",
    "traffic.classes.1.input_tokens={dist: fixed, value: 40}",  # its instruction fits
    "traffic.classes.0.output_tokens={dist: fixed, value: 8}",
    "traffic.classes.1.output_tokens={dist: fixed, value: 8}",
]


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    return struct.unpack(">II", head[16:24])


@pytest.mark.server
def test_smoke_contract_runs_end_to_end(tmp_path: Path) -> None:
    if not (BENCH_VENV / "bin" / "aiperf").exists():
        pytest.fail("the benchmark venv is missing: run scripts/setup_bench_venv.sh first")
    # The session's shared server may already run under this process: it is not ours.
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    run_dir = run_contract(REPO / "perf" / "contracts" / "smoke.yaml", TINY, tmp_path)

    results = json.loads((run_dir / "results.json").read_text())
    assert results["overrides"] == TINY
    env = results["environment"]
    assert len(env["git_commit"]) == 40
    assert len(env["model"]["sha256"]) == 64
    assert env["machine"]["cores"] >= 1 and env["machine"]["ram_gib"] > 0
    assert set(env["machine"]["isa_flags"]) == set(ISA_FLAGS)
    assert env["bench_versions"]["aiperf"] == "0.13.0"
    assert env["tritonserver"].startswith("triton 2.")

    by_name = {t["name"]: t for t in results["targets"]}
    assert set(by_name) == {"triton-vllm", "triton-vllm-grpc", "vllm-openai", "vllm-offline"}
    for name, target in by_name.items():
        assert target["status"] == "ok", f"{name}: {target['error']} {target['failed_levels']}"
        assert [lv["level"] for lv in target["levels"]] == [1.0, 2.0]
        for lv in target["levels"]:
            assert lv["requests"] == 3 and lv["errors"] == 0, (name, lv)
            # Counted as they arrived (usage, num_output_tokens, the received text): a
            # target that stops early fails here — ignore_eos forces 8 tokens each.
            assert lv["expected_tokens"] == 3 * 8 and lv["short"] == 0, (name, lv)
            assert lv["output_tokens"] == 3 * 8, (name, lv)
            assert lv["noise"]["foreign_cpu_share_during"] >= 0  # every round watched
            assert lv["output_tok_s"] > 0 and lv["ttft_ms"]["p50"] is not None
            assert lv["tpot_ms"]["p50"] is not None and lv["goodput_share"] >= 0

    rows = results["comparisons"]
    assert {(r["baseline"], r["level"]) for r in rows} == {
        ("vllm-openai", 1.0),
        ("vllm-openai", 2.0),
        ("vllm-offline", 1.0),
        ("vllm-offline", 2.0),
    }
    assert all(r["throughput_ratio"]["rounds"] == 1 for r in rows)
    # One round is no basis for a verdict; the offline ceiling never gets one.
    assert {r["throughput_verdict"] for r in rows} <= {"too few rounds", "not interleaved", "noisy"}
    assert results["rounds"] == 1 and isinstance(results["noisy"], bool)

    report = (run_dir / "report.md").read_text()
    for name in by_name:
        assert f"### {name}" in report
    for plot in ("throughput.png", "ttft_p95.png", "goodput.png"):
        width, height = png_size(run_dir / plot)
        assert width > 300 and height > 200
        assert f"]({plot})" in report

    # Everything the runner started is gone: no server, stub or engine left behind.
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert left == []
