"""Drive one concurrency level at a Triton model with perf_analyzer over gRPC streaming.

perf_analyzer is Triton's own load generator: it speaks the KServe gRPC protocol with
the decoupled stream, so it measures the server without the HTTP/SSE frontend that the
aiperf path goes through. The level's requests become perf_analyzer input data (one
entry per request, in order); ``--request-count`` bounds the run exactly, and the
profile export's per-request timestamps are reduced to the same records as aiperf's.
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


def input_data(requests: Sequence[BenchRequest], sampling: Sampling) -> dict:
    """perf_analyzer's input-data JSON: the vllm_backend inputs of every request."""
    entries = []
    for request in requests:
        params = {
            "max_tokens": request.output_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "ignore_eos": sampling.ignore_eos,
        }
        entries.append(
            {
                "text_input": [request.prompt],
                "stream": [True],
                "exclude_input_in_output": [True],
                "sampling_parameters": [json.dumps(params)],
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


def parse_export(
    export: Path, requests: Sequence[BenchRequest], exact_lengths: bool
) -> list[MeasuredRequest]:
    """Per-request timestamps → records; a request is matched to the workload by its prompt."""
    by_prompt = {r.prompt: r for r in requests}
    data = json.loads(export.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    records = []
    for experiment in data.get("experiments", []):
        for position, item in enumerate(experiment.get("requests", [])):
            start = int(item["timestamp"])
            stamps = [int(t) for t in item.get("response_timestamps", [])]
            prompt = (item.get("request_inputs") or {}).get("text_input")
            request = by_prompt.get(prompt) if isinstance(prompt, str) else None
            outputs = [o for o in item.get("response_outputs", []) if o.get("text_output")]
            # The decoupled stream ends with an empty, final-flagged response: count tokens
            # by the responses that carried text (or by stamps if outputs were not exported).
            chunks = len(outputs) if item.get("response_outputs") else len(stamps)
            ok = bool(stamps)
            if exact_lengths and request is not None:
                tokens = request.output_tokens if ok else 0
            else:
                tokens = chunks
            records.append(
                MeasuredRequest(
                    index=request.index if request is not None else position,
                    start_ns=start,
                    end_ns=stamps[-1] if stamps else start,
                    ok=ok,
                    output_tokens=tokens,
                    ttft_ms=(stamps[0] - start) / 1e6 if stamps else None,
                    chunk_gaps_ms=[(b - a) / 1e6 for a, b in itertools.pairwise(stamps)],
                    error=None if ok else "no response",
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
) -> list[MeasuredRequest]:
    """Run perf_analyzer for one level; raise ToolError if it produced no records."""
    artifacts.mkdir(parents=True, exist_ok=True)
    data = artifacts / "input_data.json"
    data.write_text(json.dumps(input_data(requests, sampling)))
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
