"""Drive one concurrency level with perf_analyzer: Triton's gRPC stream, or an OpenAI server.

perf_analyzer is Triton's own load generator: it speaks the KServe gRPC protocol with
the decoupled stream, so it measures the server without the HTTP/SSE frontend that the
aiperf path goes through. The level's requests become perf_analyzer input data (one
entry per request, in order); ``--request-count`` bounds the run exactly, and the
profile export's per-request timestamps are reduced to the same records as aiperf's.

Its ``openai`` service kind sends the same requests as streamed chat completions to an
OpenAI server (this project's frontend, vLLM's own). A comparison of protocols then has
one client on every side: the same C++ process, threads and clock, so a TTFT difference
of a few milliseconds belongs to the servers, not to two load tools of different weight.

Tokens are counted as they arrived: over gRPC every request asks the model for
``num_output_tokens`` (the tokens each streamed response carries) and the export's
values are summed per request; an export without them is unreadable, not guessed. Over
OpenAI each stream asks for ``usage`` (``stream_options.include_usage``) and its
``completion_tokens`` is the count; a stream that ended without it is an error.
"""

from __future__ import annotations

import csv
import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from tritonforge.bench.aiperf_driver import HttpEndpoint
from tritonforge.bench.contract import Sampling
from tritonforge.bench.metrics import MeasuredRequest
from tritonforge.bench.tools import read_records, run_logged, run_tool, tool_binary
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
    """Triton's KServe gRPC stream (decoupled model)."""
    protocol = ["-i", "grpc", "-u", grpc_url, "--streaming"]
    return _command(model, protocol, data, export, concurrency, count)


def openai_command(
    host_port: str, model: str, data: Path, export: Path, concurrency: int, count: int
) -> list[str]:
    """Streamed chat completions over HTTP (perf_analyzer's OpenAI client is async-only)."""
    protocol = [
        "--service-kind", "openai", "--endpoint", "v1/chat/completions",
        "-i", "http", "-u", host_port, "--async",
    ]  # fmt: skip
    return _command(model, protocol, data, export, concurrency, count)


def _command(
    model: str, protocol: list[str], data: Path, export: Path, concurrency: int, count: int
) -> list[str]:
    return [
        str(tool_binary("perf_analyzer")),
        "-m", model,
        *protocol,
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


def _exported_requests(export: Path) -> Iterator[tuple[int, dict, int, list[int]]]:
    """Each request of a profile export: position, raw item, start and response stamps (ns)."""
    data = json.loads(export.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    for experiment in data.get("experiments", []):
        for position, item in enumerate(experiment.get("requests", [])):
            stamps = [int(t) for t in item.get("response_timestamps", [])]
            yield position, item, int(item["timestamp"]), stamps


@dataclass
class _Reading:
    """What one exported request says, by a parser that knows its protocol."""

    request: BenchRequest | None  # the workload's entry its prompt matched, if any
    token_stamps: list[int]  # the responses that carried tokens: they time the tokens
    tokens: int
    error: str | None
    finish_reason: str | None


def _records(
    export: Path,
    requests: Sequence[BenchRequest],
    exact_lengths: bool,
    read: Callable[[dict, list[int], dict[str, BenchRequest]], _Reading],
) -> list[MeasuredRequest]:
    """One record per exported request, as ``read`` makes sense of it; a request no prompt
    matched keeps its export position as its index."""
    by_prompt = {r.prompt: r for r in requests}
    records = []
    for position, item, start, stamps in _exported_requests(export):
        got = read(item, stamps, by_prompt)
        known, token_stamps = got.request, got.token_stamps
        records.append(
            MeasuredRequest(
                index=known.index if known is not None else position,
                start_ns=start,
                end_ns=stamps[-1] if stamps else start,
                ok=got.error is None,
                output_tokens=got.tokens,
                ttft_ms=(token_stamps[0] - start) / 1e6 if token_stamps else None,
                chunk_gaps_ms=[(b - a) / 1e6 for a, b in itertools.pairwise(token_stamps)],
                error=got.error,
                expected_tokens=known.output_tokens
                if exact_lengths and known is not None
                else None,
                finish_reason=got.finish_reason,
            )
        )
    return records


def _read_triton(item: dict, stamps: list[int], by_prompt: dict[str, BenchRequest]) -> _Reading:
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
    error = None if stamps else "no response"
    return _Reading(request, token_stamps, sum(counts), error, reason)


def parse_export(
    export: Path, requests: Sequence[BenchRequest], exact_lengths: bool
) -> list[MeasuredRequest]:
    """Per-request timestamps and outputs → records, matched to the workload by prompt.

    Output tokens = the sum of ``num_output_tokens`` over a request's responses (the
    decoupled stream's empty final response carries 0). With ``exact_lengths``
    (ignore_eos) a request that delivered fewer than its max_tokens is *short*.
    """
    return _records(export, requests, exact_lengths, _read_triton)


def openai_input_data(requests: Sequence[BenchRequest], endpoint: HttpEndpoint) -> dict:
    """perf_analyzer's OpenAI input data: one streamed chat-completions body per request."""
    entries = []
    for request in requests:
        body = {
            "model": endpoint.model,
            "messages": [{"role": "user", "content": request.prompt}],
            "max_tokens": request.output_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        } | endpoint.extra_inputs
        entries.append({"payload": [body]})
    return {"data": entries}


def _sse_events(response: str) -> list[dict]:
    """The JSON events of one received piece of an SSE stream (``[DONE]`` and blanks dropped).

    A piece is usually one event, but nothing stops a server from flushing two at once.
    """
    events = []
    for line in response.splitlines():
        data = line.removeprefix("data:").strip() if line.startswith("data:") else ""
        if data and data != "[DONE]":
            events.append(json.loads(data))
    return events


def _carries_text(event: dict) -> bool:
    choices = event.get("choices") or []
    return any((c.get("delta") or {}).get("content") or c.get("text") for c in choices)


def _read_openai(item: dict, stamps: list[int], by_prompt: dict[str, BenchRequest]) -> _Reading:
    pieces = [_sse_events(str(o.get("response", ""))) for o in item["response_outputs"]]
    if len(pieces) != len(stamps):
        raise ValueError("response_outputs and response_timestamps differ in length")
    payload = json.loads(item["request_inputs"]["payload"])
    request = by_prompt.get(payload["messages"][-1]["content"])
    events = [e for piece in pieces for e in piece]
    usage = next((e["usage"] for e in events if e.get("usage")), None)
    reason = next(
        (
            c["finish_reason"]
            for e in events
            for c in e.get("choices") or []
            if c.get("finish_reason")
        ),
        None,
    )
    error = next((str(e["error"]) for e in events if "error" in e), None)
    if error is None and usage is None:
        error = "no response" if not stamps else "the stream ended without usage"
    token_stamps = [
        t for t, piece in zip(stamps, pieces, strict=True) if any(map(_carries_text, piece))
    ]
    tokens = int(usage["completion_tokens"]) if usage else 0
    return _Reading(request, token_stamps, tokens, error, reason)


def parse_openai_export(
    export: Path, requests: Sequence[BenchRequest], exact_lengths: bool
) -> list[MeasuredRequest]:
    """Per-request SSE pieces → records, matched to the workload by the user turn.

    Output tokens = the stream's ``usage.completion_tokens``; TTFT and the gaps between
    tokens come from the pieces that carried text (not the role-only first chunk, not
    the usage chunk). A stream without usage, or one that reported an error, is an error.
    """
    return _records(export, requests, exact_lengths, _read_openai)


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
    """Run perf_analyzer for one level over gRPC; raise ToolError if it produced no records."""
    return _measure(
        artifacts,
        input_data(requests, sampling, chat),
        partial(perf_analyzer_command, grpc_url, model),
        partial(parse_export, requests=requests, exact_lengths=sampling.ignore_eos),
        # perf_analyzer refuses fewer requests than concurrency (a short warm-up can be).
        min(concurrency, len(requests)),
        len(requests),
        max_duration_s,
    )


def run_openai_level(
    endpoint: HttpEndpoint,
    requests: Sequence[BenchRequest],
    artifacts: Path,
    concurrency: int,
    max_duration_s: float,
    exact_lengths: bool,
) -> list[MeasuredRequest]:
    """Run perf_analyzer for one level at an OpenAI chat endpoint; ToolError if no records."""
    return _measure(
        artifacts,
        openai_input_data(requests, endpoint),
        partial(openai_command, endpoint.url.removeprefix("http://"), endpoint.model),
        partial(parse_openai_export, requests=requests, exact_lengths=exact_lengths),
        min(concurrency, len(requests)),
        len(requests),
        max_duration_s,
    )


def _measure(
    artifacts: Path,
    data: dict,
    command: Callable[[Path, Path, int, int], list[str]],
    parse: Callable[[Path], list[MeasuredRequest]],
    concurrency: int,
    count: int,
    max_duration_s: float,
) -> list[MeasuredRequest]:
    artifacts.mkdir(parents=True, exist_ok=True)
    data_path = artifacts / "input_data.json"
    data_path.write_text(json.dumps(data))
    export = artifacts / "profile_export.json"
    cmd = command(data_path, export, concurrency, count)
    run = run_logged("perf_analyzer", cmd, artifacts, max_duration_s)
    return read_records(run, export, parse)


#: Triton's own per-request times in perf_analyzer's CSV: their sum is what the server
#: spent on a request (queue + compute), without the network and the client.
SERVER_COLUMNS = (
    "Server Queue",
    "Server Compute Input",
    "Server Compute Infer",
    "Server Compute Output",
)


def read_server_latency(csv_path: Path) -> dict[str, float]:
    """A non-streaming model's latency from perf_analyzer's CSV (µs), server and client."""
    with csv_path.open() as handle:
        row = next(csv.DictReader(handle))
    parts = {c.lower().replace(" ", "_") + "_us": float(row[c]) for c in SERVER_COLUMNS}
    return {
        "server_latency_us": sum(parts.values()),
        **parts,
        "client_p50_latency_us": float(row["p50 latency"]),
        "client_p99_latency_us": float(row["p99 latency"]),
        "throughput_infer_per_s": float(row["Inferences/Second"]),
    }


def server_latency(
    grpc_url: str, model: str, text: str, artifacts: Path, measurement_ms: int = 4000
) -> dict[str, float]:
    """One text through a non-streaming Triton model at concurrency 1 (a tokenizer, a guard).

    ``-s 50``: on two cores perf_analyzer's default stability bound is never met.
    """
    artifacts.mkdir(parents=True, exist_ok=True)
    data = artifacts / f"{model}_input.json"
    data.write_text(json.dumps({"data": [{"text_input": {"content": [text], "shape": [1]}}]}))
    out = artifacts / f"{model}.csv"
    cmd = [
        str(tool_binary("perf_analyzer")),
        "-m", model,
        "-u", grpc_url,
        "-i", "grpc",
        "--input-data", str(data),
        "-b", "1",
        "--concurrency-range", "1",
        "--measurement-interval", str(measurement_ms),
        "-s", "50",
        "--max-trials", "30",
        "-f", str(out),
    ]  # fmt: skip
    run = run_tool("perf_analyzer", cmd, artifacts / f"{model}.log", timeout_s=900)
    if run.exit_code != 0 or not out.is_file():
        raise run.failure(f"measuring {model}")
    return read_server_latency(out)
