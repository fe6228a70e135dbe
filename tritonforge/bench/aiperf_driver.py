"""Drive one load level at an HTTP endpoint with aiperf (from the benchmark venv).

aiperf runs as a subprocess of ``.venv-bench``; it reads the level's trace file (literal
prompts and output lengths, in order), and its per-request export is mapped back onto
the workload by position, so a request's exact max_tokens is known for every record.

Tokens are counted as they arrived: the server's own ``usage.completion_tokens`` where
the endpoint reports usage (OpenAI servers, asked with ``stream_options``); for a Triton
``generate_stream`` endpoint the model's own ``num_output_tokens`` of every streamed
chunk, read from aiperf's raw export; otherwise aiperf's ``output_sequence_length``, the
model's tokenizer over the text received. Re-tokenising decoded text is not the model's
count (8 forced tokens can come back as 7), so it is only the last resort.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tritonforge.bench.metrics import MeasuredRequest
from tritonforge.bench.tools import read_records, run_logged, tool_binary
from tritonforge.bench.workload import BenchRequest


@dataclass(frozen=True)
class HttpEndpoint:
    """How aiperf reaches a target: its endpoint type and what it adds to each request."""

    url: str
    model: str
    endpoint_type: str
    path: str | None = None
    extra_inputs: dict[str, object] = field(default_factory=dict)
    payload_template: str | None = None
    response_field: str | None = None
    # A per-chunk token count in each streamed JSON chunk (Triton's num_output_tokens):
    # when set, aiperf exports raw responses and the driver sums it per request.
    count_field: str | None = None


def _load_flags(mode: str, level: float) -> list[str]:
    if mode == "concurrency":
        return ["--concurrency", str(int(level))]
    return ["--request-rate", f"{level:g}", "--arrival-pattern", "poisson"]


def _endpoint_flags(endpoint: HttpEndpoint, artifacts: Path) -> list[str]:
    """The endpoint's path, raw export and ``--extra-inputs`` (a payload template as a file)."""
    flags = ["--endpoint", endpoint.path] if endpoint.path else []
    if endpoint.count_field:
        flags += ["--export-level", "raw"]
    extras: dict[str, object] = dict(endpoint.extra_inputs)
    if endpoint.payload_template is not None:
        template = artifacts / "payload_template.json"
        artifacts.mkdir(parents=True, exist_ok=True)
        template.write_text(endpoint.payload_template)
        extras["payload_template"] = str(template)
    if endpoint.response_field:
        extras["response_field"] = endpoint.response_field
    for key, value in extras.items():
        if isinstance(value, dict | list):
            # aiperf splits key:value on commas; a JSON object flag is read whole
            flags += ["--extra-inputs", json.dumps({key: value})]
            continue
        rendered = json.dumps(value) if not isinstance(value, str) else value
        flags += ["--extra-inputs", f"{key}:{rendered}"]
    return flags


def aiperf_command(
    endpoint: HttpEndpoint,
    trace: Path,
    artifacts: Path,
    tokenizer: Path,
    request_count: int,
    mode: str,
    level: float,
    max_duration_s: float,
    seed: int,
) -> list[str]:
    """One level's ``aiperf profile``: the trace replayed in order, streamed, one worker."""
    options = {
        "--model": endpoint.model,
        "--url": endpoint.url,
        "--endpoint-type": endpoint.endpoint_type,
        "--tokenizer": str(tokenizer),
        "--input-file": str(trace),
        "--custom-dataset-type": "mooncake_trace",
        "--dataset-sampling-strategy": "sequential",
        "--request-count": str(request_count),
        "--request-timeout-seconds": f"{max_duration_s:g}",
        "--benchmark-duration": f"{max_duration_s:g}",
        "--benchmark-grace-period": "10",
        "--random-seed": str(seed),
        "--artifact-dir": str(artifacts),
        "--ui-type": "none",
        # Two cores: one load worker keeps the client's own CPU use small and steady.
        "--workers-max": "1",
        "--record-processors": "1",
    }
    cmd = [str(tool_binary("aiperf")), "profile", "--streaming"]
    for flag, value in options.items():
        cmd += [flag, value]
    return cmd + _load_flags(mode, level) + _endpoint_flags(endpoint, artifacts)


def received_tokens(metrics: dict) -> int:
    """Output tokens that arrived: the server's usage count, else the received text's."""
    for name in ("usage_completion_tokens", "output_sequence_length"):
        value = (metrics.get(name) or {}).get("value")
        if value is not None:
            return int(value)
    return 0


def chunk_count(message: dict, field_name: str) -> int:
    """The tokens one raw SSE message says it carries (0 if it names none)."""
    total = 0
    for packet in message.get("packets") or []:
        if packet.get("name") != "data" or not packet.get("value"):
            continue
        try:
            body = json.loads(packet["value"])
        except json.JSONDecodeError:
            continue
        value = body.get(field_name) if isinstance(body, dict) else None
        if isinstance(value, list):  # a [1] tensor may come as a one-element list
            value = value[0] if value else None
        if isinstance(value, int | float):
            total += int(value)
    return total


def arrived_counts(artifacts: Path, field_name: str) -> dict[int, int]:
    """session_num → tokens the model said it sent, summed over the streamed chunks."""
    counts: dict[int, int] = {}
    # aiperf 0.13 merges its processors' raw files into one beside profile_export.jsonl.
    for path in sorted(artifacts.glob("*_raw.jsonl")):
        for line in path.read_text().splitlines():
            item = json.loads(line)
            meta = item.get("metadata") or {}
            if meta.get("benchmark_phase") != "profiling":
                continue
            tokens = sum(chunk_count(m, field_name) for m in item.get("responses") or [])
            counts[int(meta["session_num"])] = tokens
    return counts


def parse_records(
    export: Path,
    requests: Sequence[BenchRequest],
    exact_lengths: bool,
    arrived: dict[int, int] | None = None,
) -> list[MeasuredRequest]:
    """aiperf's ``profile_export.jsonl`` → records, profiling phase only.

    With ``exact_lengths`` (ignore_eos) each record carries the max_tokens it forced, so a
    request that delivered fewer ends *short* instead of being credited what it asked.
    ``arrived`` (session_num → the model's own count) takes precedence over aiperf's.
    """
    records = []
    for line in export.read_text().splitlines():
        item = json.loads(line)
        meta = item["metadata"]
        if meta.get("benchmark_phase") != "profiling":
            continue
        request = requests[meta["session_num"] % len(requests)]
        metrics = item.get("metrics") or {}
        error = item.get("error")
        ttft = metrics.get("time_to_first_token", {}).get("value")
        cancelled = bool(meta.get("was_cancelled", False))
        message = None
        if error is not None:
            message = (
                f"{error.get('type') or 'error'} {error.get('code') or ''}: {error.get('message')}"
            )
        elif cancelled:
            message = "cancelled (the level ran past max_duration_s)"
        records.append(
            MeasuredRequest(
                index=request.index,
                start_ns=int(meta["request_start_ns"]),
                end_ns=int(meta.get("request_end_ns") or meta["request_start_ns"]),
                ok=message is None,
                output_tokens=(
                    arrived[meta["session_num"]]
                    if arrived is not None and meta["session_num"] in arrived
                    else received_tokens(metrics)
                ),
                ttft_ms=ttft,
                chunk_gaps_ms=list(metrics.get("inter_chunk_latency", {}).get("value", []) or []),
                error=message[:300] if message else None,
                expected_tokens=request.output_tokens if exact_lengths else None,
            )
        )
    return records + unrecorded(records, requests, exact_lengths)


def unrecorded(
    records: Sequence[MeasuredRequest], requests: Sequence[BenchRequest], exact_lengths: bool
) -> list[MeasuredRequest]:
    """A failed record for each request of the level that aiperf exported no record of.

    aiperf stops at ``--benchmark-duration`` and drops what it had not finished: such a
    request was asked for and delivered nothing measurable, so it counts against the
    level instead of vanishing from it.
    """
    if not records:
        return []  # no export at all is the tool's failure (ToolError), not the level's
    seen = {r.index for r in records}
    end = max(r.end_ns for r in records)
    return [
        MeasuredRequest(
            index=q.index,
            start_ns=end,
            end_ns=end,
            ok=False,
            error="no record: not sent or not finished within max_duration_s",
            sent=False,
            expected_tokens=q.output_tokens if exact_lengths else None,
        )
        for q in requests
        if q.index not in seen
    ]


def run_level(
    endpoint: HttpEndpoint,
    requests: Sequence[BenchRequest],
    trace: Path,
    artifacts: Path,
    tokenizer: Path,
    mode: str,
    level: float,
    max_duration_s: float,
    seed: int,
    exact_lengths: bool,
) -> list[MeasuredRequest]:
    """Run aiperf for one level and return its records; raise ToolError if it produced none."""
    artifacts.mkdir(parents=True, exist_ok=True)
    cmd = aiperf_command(
        endpoint, trace, artifacts, tokenizer, len(requests), mode, level, max_duration_s, seed
    )
    run = run_logged("aiperf", cmd, artifacts, max_duration_s, cwd=artifacts)

    def parse(export: Path) -> list[MeasuredRequest]:
        arrived = arrived_counts(artifacts, endpoint.count_field) if endpoint.count_field else None
        return parse_records(export, requests, exact_lengths, arrived)

    return read_records(run, artifacts / "profile_export.jsonl", parse)
