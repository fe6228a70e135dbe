"""Tokens are counted as they arrived, from the tools' recorded per-request exports.

Each test starts from an export the real tool wrote (tests/unit/data/bench_exports) and,
where it checks under-delivery, edits a copy so one request delivers less than it was
forced to: the count, the end state and the level's figures must all show it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tritonforge.bench.aiperf_driver import arrived_counts, parse_records
from tritonforge.bench.contract import Slo
from tritonforge.bench.metrics import summarize
from tritonforge.bench.perf_analyzer_driver import parse_export, parse_openai_export
from tritonforge.bench.tools import ToolError, ToolRun, read_records
from tritonforge.bench.workload import BenchRequest

EXPORTS = Path(__file__).parent / "data" / "bench_exports"
PROMPTS = [f"{i}. Tell me a story about a red fox and a lighthouse keeper." for i in range(3)]
REQUESTS = [BenchRequest(i, "chat", p, 14, 8, False) for i, p in enumerate(PROMPTS)]
SLO = Slo(ttft_p95_ms=60_000, tpot_p95_ms=1_000, error_budget=0.0)


def perf_analyzer_export(name: str) -> dict:
    return json.loads((EXPORTS / name).read_text())


def write(tmp_path: Path, data: dict | list[dict], name: str) -> Path:
    path = tmp_path / name
    if isinstance(data, list):
        path.write_text("\n".join(json.dumps(line) for line in data) + "\n")
    else:
        path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    "name", ["perf_analyzer_vllm_model_text.json", "perf_analyzer_vllm_model_chat.json"]
)
def test_perf_analyzer_counts_num_output_tokens_of_each_response(name: str) -> None:
    records = parse_export(EXPORTS / name, REQUESTS, exact_lengths=True)
    assert sorted(r.index for r in records) == [0, 1, 2]  # matched by text or by messages
    responses = [
        len(r["response_outputs"]) for r in perf_analyzer_export(name)["experiments"][0]["requests"]
    ]
    for r, count in zip(records, responses, strict=True):
        assert (r.output_tokens, r.expected_tokens, r.state) == (8, 8, "finished")
        assert r.finish_reason == "length"
        assert r.ttft_ms is not None and r.ttft_ms > 0 and len(r.chunk_gaps_ms) == count - 1
    m = summarize(2, records, SLO)
    assert (m.output_tokens, m.expected_tokens, m.short, m.errors) == (24, 24, 0, 0)


def test_a_perf_analyzer_request_that_stops_early_is_short_and_counts_what_arrived(
    tmp_path: Path,
) -> None:
    data = perf_analyzer_export("perf_analyzer_vllm_model_text.json")
    cut = data["experiments"][0]["requests"][0]
    # Its responses carry 2, 2, 1, 1, 1, 1 tokens (a response per *text* delta, not per
    # token: counting responses would have said 6): keep the first three, 5 tokens.
    cut["response_timestamps"] = cut["response_timestamps"][:3]
    cut["response_outputs"] = cut["response_outputs"][:3]
    records = parse_export(write(tmp_path, data, "export.json"), REQUESTS, exact_lengths=True)
    short = next(r for r in records if r.output_tokens != 8)
    assert (short.output_tokens, short.state) == (5, "short")
    m = summarize(2, records, SLO)
    assert m.output_tokens == 21 and m.expected_tokens == 24  # not 3 x 8
    assert m.short == 1 and m.errors == 0 and m.error_share == pytest.approx(1 / 3)
    assert m.goodput_share == pytest.approx(2 / 3)  # the short one is not good
    assert not m.slo_met  # no error budget for short requests
    assert any(s.startswith("short: 5 of 8") for s in m.error_samples)


def test_a_perf_analyzer_export_without_token_counts_is_unreadable_not_guessed(
    tmp_path: Path,
) -> None:
    data = perf_analyzer_export("perf_analyzer_vllm_model_text.json")
    for request in data["experiments"][0]["requests"]:
        for output in request["response_outputs"]:
            del output["num_output_tokens"]
    export = write(tmp_path, data, "export.json")
    run = ToolRun("perf_analyzer", 0, 1.0, tmp_path / "none.log")
    with pytest.raises(ToolError, match="num_output_tokens"):
        read_records(run, export, lambda p: parse_export(p, REQUESTS, exact_lengths=True))


def aiperf_lines(name: str) -> list[dict]:
    return [json.loads(line) for line in (EXPORTS / name).read_text().splitlines()]


def test_aiperf_on_an_openai_server_counts_the_servers_usage(tmp_path: Path) -> None:
    lines = aiperf_lines("aiperf_openai_chat.jsonl")
    records = parse_records(EXPORTS / "aiperf_openai_chat.jsonl", REQUESTS, exact_lengths=True)
    assert [r.state for r in records] == ["finished"] * 3
    assert sum(r.output_tokens for r in records) == 24
    # The server's usage wins over aiperf's own count of the text.
    edited = copy.deepcopy(lines)
    edited[0]["metrics"]["usage_completion_tokens"]["value"] = 3
    (first, *_) = parse_records(write(tmp_path, edited, "e.jsonl"), REQUESTS, exact_lengths=True)
    assert (first.output_tokens, first.state) == (3, "short")


def test_aiperf_on_generate_stream_counts_the_received_text_with_the_tokenizer(
    tmp_path: Path,
) -> None:
    lines = aiperf_lines("aiperf_triton_generate_stream.jsonl")
    assert all("usage_completion_tokens" not in line["metrics"] for line in lines)
    records = parse_records(
        EXPORTS / "aiperf_triton_generate_stream.jsonl", REQUESTS, exact_lengths=True
    )
    assert [(r.output_tokens, r.state) for r in records] == [(8, "finished")] * 3
    lines[1]["metrics"]["output_sequence_length"]["value"] = 6
    records = parse_records(write(tmp_path, lines, "e.jsonl"), REQUESTS, exact_lengths=True)
    m = summarize(1, records, SLO)
    assert (m.output_tokens, m.short) == (22, 1)


def test_generate_stream_counts_the_models_own_num_output_tokens(tmp_path: Path) -> None:
    # Recorded: 8 forced tokens each; aiperf's re-tokenised text says 5 for the third.
    run = EXPORTS / "aiperf_generate_stream_raw"
    smoke = [BenchRequest(i, "chat", p, 14, 8, False) for i, p in enumerate(PROMPTS)]
    retokenised = parse_records(run / "profile_export.jsonl", smoke, exact_lengths=True)
    assert [r.output_tokens for r in retokenised] == [8, 8, 5]
    arrived = arrived_counts(run, "num_output_tokens")
    assert arrived == {0: 8, 1: 8, 2: 8}
    records = parse_records(run / "profile_export.jsonl", smoke, True, arrived)
    assert [(r.output_tokens, r.state) for r in records] == [(8, "finished")] * 3
    # A chunk lost on the way is a short request, whatever the text re-encodes to.
    raw = aiperf_lines("aiperf_generate_stream_raw/profile_export_raw.jsonl")
    del raw[1]["responses"][-1]
    write(tmp_path, raw, "profile_export_raw.jsonl")
    records = parse_records(
        run / "profile_export.jsonl", smoke, True, arrived_counts(tmp_path, "num_output_tokens")
    )
    assert [(r.output_tokens, r.state) for r in records][1] == (7, "short")


def test_an_aiperf_request_with_an_error_keeps_the_tokens_that_arrived(tmp_path: Path) -> None:
    lines = aiperf_lines("aiperf_openai_chat.jsonl")
    lines[2]["error"] = {"code": 503, "type": "Service Unavailable", "message": "busy"}
    lines[2]["metrics"]["usage_completion_tokens"]["value"] = 2
    records = parse_records(write(tmp_path, lines, "e.jsonl"), REQUESTS, exact_lengths=True)
    failed = records[2]
    assert (failed.state, failed.output_tokens) == ("error", 2)
    assert "503" in (failed.error or "")
    m = summarize(2, records, SLO)
    assert (m.errors, m.short, m.output_tokens) == (1, 0, 18)
    assert m.requests_s * m.duration_s == pytest.approx(2)  # finished requests only


def test_without_forced_lengths_only_an_empty_answer_is_short(tmp_path: Path) -> None:
    lines = aiperf_lines("aiperf_openai_chat.jsonl")
    lines[0]["metrics"]["usage_completion_tokens"]["value"] = 3
    lines[1]["metrics"]["usage_completion_tokens"]["value"] = 0
    records = parse_records(write(tmp_path, lines, "e.jsonl"), REQUESTS, exact_lengths=False)
    assert [(r.expected_tokens, r.state) for r in records] == [
        (None, "finished"),  # an EOS before max_tokens is a normal end
        (None, "short"),
        (None, "finished"),
    ]


OPENAI_EXPORTS = [
    "perf_analyzer_openai_frontend_chat.json",  # python -m tritonforge.openai
    "perf_analyzer_vllm_openai_chat.json",  # vLLM's own server (stream ends with usage)
]


@pytest.mark.parametrize("name", OPENAI_EXPORTS)
def test_perf_analyzer_on_an_openai_server_counts_the_streams_usage(name: str) -> None:
    records = parse_openai_export(EXPORTS / name, REQUESTS, exact_lengths=True)
    assert sorted(r.index for r in records) == [0, 1, 2]  # matched by the user turn
    for item, r in zip(
        perf_analyzer_export(name)["experiments"][0]["requests"], records, strict=True
    ):
        assert (r.output_tokens, r.state, r.finish_reason) == (8, "finished", "length")
        # First token = the first piece with text: not the role-only chunk, which may come
        # earlier, and the gaps are between the 8 text pieces only.
        assert r.ttft_ms is not None and r.ttft_ms > 0 and len(r.chunk_gaps_ms) == 7
        assert r.ttft_ms >= (item["response_timestamps"][0] - item["timestamp"]) / 1e6
    m = summarize(2, records, SLO)
    assert (m.output_tokens, m.expected_tokens, m.short, m.errors) == (24, 24, 0, 0)


def test_an_openai_stream_that_reports_fewer_tokens_is_short(tmp_path: Path) -> None:
    data = perf_analyzer_export("perf_analyzer_vllm_openai_chat.json")
    item = data["experiments"][0]["requests"][1]
    for output in item["response_outputs"]:
        output["response"] = output["response"].replace(
            '"completion_tokens":8', '"completion_tokens":5'
        )
    records = parse_openai_export(write(tmp_path, data, "e.json"), REQUESTS, exact_lengths=True)
    assert sorted((r.output_tokens, r.state) for r in records)[0] == (5, "short")
    assert summarize(2, records, SLO).output_tokens == 21


def test_an_openai_stream_without_usage_is_an_error_and_credits_no_tokens(
    tmp_path: Path,
) -> None:
    data = perf_analyzer_export("perf_analyzer_openai_frontend_chat.json")
    item = data["experiments"][0]["requests"][0]
    kept = [
        (t, o)
        for t, o in zip(item["response_timestamps"], item["response_outputs"], strict=True)
        if '"completion_tokens"' not in o["response"]
    ]
    assert len(kept) == len(item["response_outputs"]) - 1  # exactly the usage chunk went
    item["response_timestamps"], item["response_outputs"] = map(list, zip(*kept, strict=True))
    records = parse_openai_export(write(tmp_path, data, "e.json"), REQUESTS, exact_lengths=True)
    broken = next(r for r in records if not r.ok)
    assert (broken.output_tokens, broken.error) == (0, "the stream ended without usage")
    m = summarize(2, records, SLO)
    assert (m.output_tokens, m.errors) == (16, 1) and not m.slo_met
