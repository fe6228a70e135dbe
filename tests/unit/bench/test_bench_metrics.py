"""Records → level metrics and the report, from hand-made records (no server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tritonforge.bench.aiperf_driver import parse_records
from tritonforge.bench.contract import Comparison, Sampling, Slo
from tritonforge.bench.metrics import MeasuredRequest, Percentiles, percentile, summarize
from tritonforge.bench.perf_analyzer_driver import input_data, parse_export
from tritonforge.bench.report import _comparison_table
from tritonforge.bench.results import LevelFailure, TargetResult, compare
from tritonforge.bench.server_metrics import delta, parse, per_request_ms
from tritonforge.bench.workload import BenchRequest

SLO = Slo(ttft_p95_ms=100, tpot_p95_ms=20, error_budget=0.1)
MS = 1_000_000


def record(index: int, start_ms: float, ttft: float, e2e: float, tokens: int, ok: bool = True):
    return MeasuredRequest(
        index=index,
        start_ns=int(start_ms * MS),
        end_ns=int((start_ms + e2e) * MS),
        ok=ok,
        output_tokens=tokens if ok else 0,
        ttft_ms=ttft if ok else None,
        error=None if ok else "HTTP 500: boom",
    )


def test_percentiles_interpolate_like_numpy() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.5
    p95 = percentile(values, 95)
    assert p95 is not None and round(p95, 2) == 95.05
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0  # unsorted input
    assert percentile([], 50) is None
    assert Percentiles.of([]).p50 is None


def test_tpot_excludes_the_first_token() -> None:
    assert record(0, 0, ttft=40, e2e=130, tokens=10).tpot_ms == 10.0
    assert record(0, 0, ttft=40, e2e=40, tokens=1).tpot_ms is None


def test_summary_counts_goodput_errors_and_throughput_over_wall_time() -> None:
    records = [
        record(0, 0, ttft=50, e2e=230, tokens=10),  # TPOT 20: within SLO
        record(1, 0, ttft=150, e2e=330, tokens=10),  # TTFT over the SLO
        record(2, 500, ttft=50, e2e=500, tokens=10),  # TPOT 50: over the SLO
        record(3, 600, ttft=0, e2e=400, tokens=0, ok=False),
    ]
    m = summarize(4, records, SLO)
    assert m.requests == 4 and m.errors == 1 and m.error_share == 0.25
    assert m.duration_s == 1.0  # 0 ms → 1,000 ms
    assert m.output_tokens == 30 and m.output_tok_s == 30.0
    assert m.requests_s == 3.0
    assert m.goodput_rps == 1.0 and m.goodput_share == 0.25
    assert not m.slo_met  # 25 % errors > 10 % budget
    assert m.error_samples == ["HTTP 500: boom"]


def test_slo_is_met_when_every_bound_holds() -> None:
    records = [record(i, i * 10, ttft=30, e2e=30 + 9 * 15, tokens=10) for i in range(20)]
    m = summarize(1, records, SLO)
    assert m.slo_met and m.goodput_share == 1.0


def test_aiperf_records_map_back_to_the_workload_by_position(tmp_path: Path) -> None:
    requests = [BenchRequest(i, "chat", f"p{i}", 10, 5 + i, False) for i in range(3)]
    lines = [
        {"metadata": {"session_num": 0, "benchmark_phase": "warmup", "request_start_ns": 1}},
        {
            "metadata": {
                "session_num": 1,
                "benchmark_phase": "profiling",
                "request_start_ns": 1_000_000,
                "request_end_ns": 9_000_000,
            },
            "metrics": {
                "time_to_first_token": {"value": 2.5},
                "output_sequence_length": {"value": 5},
                "inter_chunk_latency": {"value": [1.0, 1.5]},
            },
        },
        {
            "metadata": {
                "session_num": 2,
                "benchmark_phase": "profiling",
                "request_start_ns": 2_000_000,
                "request_end_ns": 3_000_000,
            },
            "metrics": {},
            "error": {"code": 400, "type": "Bad Request", "message": "no such input"},
        },
    ]
    export = tmp_path / "profile_export.jsonl"
    export.write_text("\n".join(json.dumps(line) for line in lines))
    short, failed, missing = parse_records(export, requests, exact_lengths=True)
    # Request 0 has only a warm-up record: it is missing from the level, counted failed.
    assert (missing.index, missing.state, missing.expected_tokens) == (0, "error", 5)
    assert "no record" in missing.error
    # Request 1 was forced to 6 tokens and 5 arrived: it is short, credited 5, not 6.
    assert (short.index, short.ok, short.output_tokens, short.ttft_ms) == (1, True, 5, 2.5)
    assert (short.expected_tokens, short.state) == (6, "short")
    assert short.chunk_gaps_ms == [1.0, 1.5]
    assert (failed.index, failed.state, failed.output_tokens) == (2, "error", 0)
    assert "400" in failed.error and "no such input" in failed.error
    counted = parse_records(export, requests, exact_lengths=False)[0]
    assert (counted.output_tokens, counted.state) == (5, "finished")


def level(value: float, tok_s: float, ttft_p50: float, round_: int = 0):
    records = [record(0, 0, ttft=ttft_p50, e2e=ttft_p50 + 100, tokens=int(tok_s))]
    m = summarize(value, records, SLO)
    return m.model_copy(update={"output_tok_s": tok_s, "round": round_})


def rounds(value: float, tok_s: list[float], ttft: list[float]):
    return [level(value, t, f, r) for r, (t, f) in enumerate(zip(tok_s, ttft, strict=True))]


def target(name: str, levels, status: str = "ok", **fields) -> TargetResult:
    return TargetResult(
        name=name, kind="triton", tool="aiperf", status=status, levels=levels, **fields
    )


SPEC = Comparison(target="t", baseline="b", min_throughput_ratio=1.0, max_ttft_p50_delta_ms=3)


def test_comparisons_pair_rounds_and_judge_their_spread() -> None:
    mine = target(
        "t",
        rounds(1, [21, 22, 21.5], [52, 51, 52])  # every round ≥ 1.0x, ≤ +3 ms: met
        + rounds(8, [150, 170, 160], [80, 90, 85])  # ratios straddle 1.0: inconclusive
        + rounds(32, [300, 310, 305], [100, 100, 100]),  # every round behind: missed
    )
    base = target(
        "b",
        rounds(1, [21, 21, 21], [50, 50, 50])
        + rounds(8, [160, 160, 160], [86, 86, 80])
        + rounds(32, [320, 330, 320], [90, 90, 90]),
    )
    one, eight, thirty_two = compare(SPEC, mine, base, [1, 8, 32])
    assert one.rounds == 3 and one.throughput_verdict == "met" and one.ttft_verdict == "met"
    assert one.throughput_ratio.median == pytest.approx(21.5 / 21)
    assert (one.ttft_p50_delta_ms.min, one.ttft_p50_delta_ms.max) == (1, 2)
    assert eight.throughput_verdict == "inconclusive" and eight.ttft_verdict == "inconclusive"
    assert thirty_two.throughput_verdict == "missed" and thirty_two.ttft_verdict == "missed"


def test_a_relative_ttft_bound_is_judged_per_round_and_shown_only_when_set() -> None:
    """An ensemble's allowance (≤ 5 % over the direct model) scales with the TTFT itself."""
    spec = Comparison(target="t", baseline="b", max_ttft_p50_ratio=1.05)
    mine = target(
        "t",
        rounds(1, [20, 20, 20], [2040, 2080, 2100])  # +2 / +4 / +5 %: met
        + rounds(8, [20, 20, 20], [2000, 2200, 2000]),  # one round at +10 %: inconclusive
    )
    base = target(
        "b", rounds(1, [20, 20, 20], [2000, 2000, 2000]) + rounds(8, [20] * 3, [2000] * 3)
    )
    one, eight = compare(spec, mine, base, [1, 8])
    assert one.ttft_ratio_verdict == "met" and one.ttft_p50_ratio.max == pytest.approx(1.05)
    assert eight.ttft_ratio_verdict == "inconclusive"
    assert one.ttft_verdict is None and one.throughput_verdict is None  # bounds not set
    table = "\n".join(_comparison_table([one, eight]))
    assert "TTFT p50 ratio" in table and "1.040 (1.020–1.050) | 1.05 | met |" in table
    # Without the bound the table keeps its usual columns.
    (plain,) = compare(SPEC, mine, base, [1])
    assert (
        plain.ttft_ratio_verdict is None and "TTFT p50 ratio" not in _comparison_table([plain])[0]
    )


def test_no_verdict_when_noisy_not_interleaved_or_too_few_rounds() -> None:
    mine = target("t", rounds(1, [30, 30, 30], [50, 50, 50]))
    base = target("b", rounds(1, [20, 20, 20], [50, 50, 50]))
    (noisy,) = compare(SPEC, mine, base, [1], noisy=True)
    assert (noisy.throughput_verdict, noisy.ttft_verdict) == ("noisy", "noisy")
    assert noisy.throughput_ratio.median == 1.5  # the numbers are still recorded
    alone = base.model_copy(update={"interleaved": False})
    assert compare(SPEC, mine, alone, [1])[0].throughput_verdict == "not interleaved"
    two = target("b", rounds(1, [20, 20], [50, 50]))
    assert compare(SPEC, mine, two, [1])[0].throughput_verdict == "too few rounds"
    failed = target("b", [], status="partial", failed_levels={"1 round 1": LevelFailure(error="x")})
    row = compare(SPEC, mine, failed, [1])[0]
    assert row.rounds == 0 and row.throughput_ratio is None
    assert row.throughput_verdict == "too few rounds"
    no_threshold = Comparison(target="t", baseline="b")
    assert compare(no_threshold, mine, base, [1])[0].throughput_verdict is None


PROM = """# HELP nv_inference_request_success Number of successful inference requests
nv_inference_request_success{model="vllm_model",version="1"} 10
nv_inference_request_success{model="other",version="1"} 99
nv_inference_queue_duration_us{model="vllm_model",version="1"} 5000
nv_inference_pending_request_count{model="vllm_model",version="1"} 3
vllm:time_to_first_token_seconds_sum{model_name="m"} 1.5
vllm:time_to_first_token_seconds_count{model_name="m"} 10
vllm:num_requests_running{model_name="m"} 4
"""


def test_server_counters_are_per_model_and_gauges_are_ignored() -> None:
    before = parse(PROM, "vllm_model")
    assert before["nv_inference_request_success"] == 10
    assert "nv_inference_pending_request_count" not in before
    assert "vllm:num_requests_running" not in before
    after = parse(PROM.replace("} 10\n", "} 14\n").replace("5000", "9000"), "vllm_model")
    moved = delta(before, after)
    assert moved["nv_inference_request_success"] == 4
    times = per_request_ms(moved)
    assert times["queue"] == 1.0  # 4,000 µs over 4 requests


def test_perf_analyzer_input_data_carries_each_requests_max_tokens() -> None:
    requests = [BenchRequest(i, "chat", f"p{i}", 10, 5 + i, False) for i in range(2)]
    data = input_data(requests, Sampling())["data"]
    assert [entry["text_input"] for entry in data] == [["p0"], ["p1"]]
    assert json.loads(data[1]["sampling_parameters"][0])["max_tokens"] == 6
    assert data[0]["stream"] == [True] and data[0]["exclude_input_in_output"] == [True]
    assert data[0]["return_num_output_tokens"] == [True]  # what arrived is counted
    chat = input_data(requests, Sampling(), chat=True)["data"]
    assert "text_input" not in chat[0]
    assert json.loads(chat[1]["messages"][0]) == [{"role": "user", "content": "p1"}]


def test_perf_analyzer_export_maps_requests_by_prompt_and_counts_text_responses(
    tmp_path: Path,
) -> None:
    requests = [BenchRequest(i, "chat", f"p{i}", 10, 3, False) for i in range(2)]
    export = tmp_path / "profile_export.json"
    export.write_text(
        json.dumps(
            {
                "experiments": [
                    {
                        "requests": [
                            {
                                "timestamp": 1_000_000,
                                "request_inputs": {"text_input": "p1"},
                                "response_timestamps": [3_000_000, 4_000_000, 6_000_000, 6_100_000],
                                "response_outputs": [
                                    {"text_output": "a", "num_output_tokens": 1},
                                    {"text_output": "b", "num_output_tokens": 1},
                                    {"text_output": "c", "num_output_tokens": 1},
                                    {"text_output": "", "num_output_tokens": 0},
                                ],
                            },
                            {"timestamp": 2_000_000, "request_inputs": {"text_input": "p0"}},
                        ]
                    }
                ]
            }
        )
    )
    done, failed = parse_export(export, requests, exact_lengths=False)
    assert (done.index, done.ok, done.output_tokens, done.ttft_ms) == (1, True, 3, 2.0)
    assert done.chunk_gaps_ms == [1.0, 2.0]  # the empty final response carries no token
    assert done.end_ns == 6_100_000
    assert (failed.index, failed.ok, failed.error) == (0, False, "no response")
