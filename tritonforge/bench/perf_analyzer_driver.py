"""Drive one concurrency level at a Triton model with perf_analyzer over gRPC streaming.

perf_analyzer is Triton's own load generator: it speaks the KServe gRPC protocol with
the decoupled stream, so it measures the server without the HTTP/SSE frontend that the
aiperf path goes through. The level's requests become perf_analyzer input data (one
entry per request, in order); ``--request-count`` bounds the run exactly, and the
profile export's per-request timestamps are reduced to the same records as aiperf's.

Tokens are counted as they arrived: every request asks the model for
``num_output_tokens`` (the tokens each streamed response carries) and the export's
values are summed per request; an export without them is unreadable, not guessed.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from functools import partial
from pathlib import Path

from tritonforge.bench.contract import Sampling
from tritonforge.bench.metrics import MeasuredRequest
from tritonforge.bench.tools import STARTUP_ALLOWANCE_S, read_records, run_tool, tool_binary
from tritonforge.bench.workload import BenchRequest


def chat_messages(prompt: str) -> str:
    """The ``messages`` input for a prompt sent as one user turn (the model's chat template)."""
    return json.dumps([{"role": "user", "content": prompt}])


def input_data(requests: Sequence[BenchRequest], sampling: Sampling, chat: bool = False) -> dict:
    """perf_analyzer's input-data JSON: the vllm_backend inputs of every request.

    ``return_num_output_tokens`` and ``return_finish_reason`` make each response say how
    many tokens it carries and why the stream ended, so nothing has to be assumed.
    """
    entries = []
    for request in requests:
        params = {
            "max_tokens": request.output_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "ignore_eos": sampling.ignore_eos,
        }
        prompt = (
            {"messages": [chat_messages(request.prompt)]}
            if chat
            else {"text_input": [request.prompt]}
        )
        entries.append(
            prompt
            | {
                "stream": [True],
                "exclude_input_in_output": [True],
                "sampling_parameters": [json.dumps(params)],
                "return_num_output_tokens": [True],
                "return_finish_reason": [True],
            }
        )
    return {"data": entries}


def perf_analyzer_command(
    grpc_url: str, model: str, data: Path, export: Path, concurrency: int, count: int
) -> list[str]:
    return [
        str(tool_binary("perf_analyzer")),
        "-m", model,
        "-i", "grpc",
        "-u", grpc_url,
        "--streaming",
        "--input-data", str(data),
        "--concurrency-range", f"{concurrency}:{concurrency}",
        "--request-count", str(count),
        "--profile-export-file", str(export),
        # Two cores: latency between windows varies more than the default 10 %
        # stability band allows, so perf_analyzer would never settle.
        "-s", "50",
    ]  # fmt: skip


def _scalar(value: object) -> object:
    """An exported output as one value: perf_analyzer writes a 1-element tensor either way."""
    while isinstance(value, list):
        if len(value) != 1:
            raise ValueError(f"expected one element, got {value!r}")
        value = value[0]
    return value


def _prompt_of(inputs: dict) -> str | None:
    """The prompt a request carried: its text_input, or the user turn of its messages."""
    if isinstance(inputs.get("text_input"), str):
        return inputs["text_input"]
    messages = inputs.get("messages")
    if isinstance(messages, str):
        turns = json.loads(messages)
        return turns[-1]["content"] if turns else None
    return None


def parse_export(
    export: Path, requests: Sequence[BenchRequest], exact_lengths: bool
) -> list[MeasuredRequest]:
    """Per-request timestamps and outputs → records, matched to the workload by prompt.

    Output tokens = the sum of ``num_output_tokens`` over a request's responses (the
    decoupled stream's empty final response carries 0). With ``exact_lengths``
    (ignore_eos) a request that delivered fewer than its max_tokens is *short*.
    """
    by_prompt = {r.prompt: r for r in requests}
    data = json.loads(export.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    records = []
    for experiment in data.get("experiments", []):
        for position, item in enumerate(experiment.get("requests", [])):
            start = int(item["timestamp"])
            stamps = [int(t) for t in item.get("response_timestamps", [])]
            request = by_prompt.get(_prompt_of(item.get("request_inputs") or {}) or "")
            outputs = item.get("response_outputs", [])
            if stamps and (
                len(outputs) != len(stamps) or any("num_output_tokens" not in o for o in outputs)
            ):
                raise ValueError("responses without num_output_tokens: cannot count tokens")
            counts = [int(str(_scalar(o["num_output_tokens"]))) for o in outputs]
            reasons = [str(_scalar(o.get("finish_reason", ""))) for o in outputs]
            # Responses before the last say "None" (Python's None as a string) or nothing.
            reason = next((r for r in reversed(reasons) if r not in ("", "None")), None)
            # Only responses that carried tokens time the tokens (not the empty final one).
            token_stamps = [t for t, n in zip(stamps, counts, strict=True) if n]
            first = token_stamps[0] if token_stamps else None
            tokens = sum(counts)
            records.append(
                MeasuredRequest(
                    index=request.index if request is not None else position,
                    start_ns=start,
                    end_ns=stamps[-1] if stamps else start,
                    ok=bool(stamps),
                    output_tokens=tokens,
                    ttft_ms=(first - start) / 1e6 if first is not None else None,
                    chunk_gaps_ms=[(b - a) / 1e6 for a, b in itertools.pairwise(token_stamps)],
                    error=None if stamps else "no response",
                    expected_tokens=request.output_tokens
                    if exact_lengths and request is not None
                    else None,
                    finish_reason=reason,
                )
            )
    return records


def run_level(
    grpc_url: str,
    model: str,
    requests: Sequence[BenchRequest],
    sampling: Sampling,
    artifacts: Path,
    concurrency: int,
    max_duration_s: float,
    chat: bool = False,
) -> list[MeasuredRequest]:
    """Run perf_analyzer for one level; raise ToolError if it produced no records."""
    artifacts.mkdir(parents=True, exist_ok=True)
    data = artifacts / "input_data.json"
    data.write_text(json.dumps(input_data(requests, sampling, chat)))
    export = artifacts / "profile_export.json"
    # perf_analyzer refuses fewer requests than concurrency (a short warm-up can be).
    concurrency = min(concurrency, len(requests))
    cmd = perf_analyzer_command(grpc_url, model, data, export, concurrency, len(requests))
    (artifacts / "command.txt").write_text(" ".join(cmd) + "\n")
    run = run_tool(
        "perf_analyzer",
        cmd,
        artifacts / "perf_analyzer.log",
        timeout_s=max_duration_s + STARTUP_ALLOWANCE_S,
    )
    parse = partial(parse_export, requests=requests, exact_lengths=sampling.ignore_eos)
    return read_records(run, export, parse)
