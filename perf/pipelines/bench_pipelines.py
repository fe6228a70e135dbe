"""Pipeline benchmark: ensemble_vllm (C++ tokenizer) vs vllm_model vs ensemble_vllm_py.

Why this shape: the question is what the ensemble costs over calling the LLM directly —
TTFT and output tok/s at concurrency 1, 8 and 32, same server, same load. The driver is
a small tritonclient gRPC-streaming client (one stream per concurrent worker) so that
every model gets byte-identical traffic and the three targets can be interleaved
round by round, which spreads the drift of a 2-core machine shared with other work
over all of them instead of the one measured last. Every prompt starts with a unique
number so vLLM's prefix cache never turns a prefill into a cache hit; ``ignore_eos``
forces the output length. Tokens are counted as they arrive (each response's
``num_output_tokens``), never assumed: output tok/s = tokens received / wall time, and
a request that ends with fewer than max_tokens is *short* and counted as such.

    .venv/bin/python perf/pipelines/bench_pipelines.py   # -> perf/results/pipelines/<UTC>/

Writes results.json (per model and concurrency: TTFT p50/p90, e2e p50, output tok/s,
errors; plus versions and machine) and report.md. A point where no request succeeded
(server error, broken stream) is recorded as failed with the client's first error, and
the run goes on.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import queue
import statistics
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from tritonforge.bench.environment import (
    Environment,
    capture,
    describe_machine,
    tritonserver_version,
)
from tritonforge.launch.launcher import TritonServer
from tritonforge.launch.model_store import ensure_default_model
from tritonforge.paths import REPO_ROOT

MODELS = ("vllm_model", "ensemble_vllm", "ensemble_vllm_py")
SERVED = (*MODELS, "preprocessing", "preprocessing_py", "postprocessing")
BASE_PROMPT = (
    "Write a short, friendly note to a colleague about the quarterly planning meeting. "
    "Mention that the agenda covers the roadmap, hiring, the budget for the new data "
    "platform, and the customer feedback survey. Ask them to bring their notes on the "
    "migration project, and remind them that the meeting starts at ten in the large room "
    "on the third floor. Close with a thank-you for their help with last month's release."
)
_serial = itertools.count()


@dataclass
class Sample:
    ttft_s: float
    e2e_s: float
    ok: bool
    error: str | None = None
    tokens: int = 0  # output tokens that arrived (sum of num_output_tokens)
    short: bool = False  # ended without error but with fewer tokens than forced


@dataclass
class Point:
    """One model at one concurrency; the latencies are None when no request succeeded."""

    model: str
    concurrency: int
    requests: int
    errors: int
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    e2e_p50_ms: float | None
    output_tok_s: float  # tokens that arrived / wall time
    error: str | None = None  # the first client error, when no request succeeded
    short: int = 0  # requests that ended without error but under max_tokens
    output_tokens: int = 0  # tokens that arrived, over every request


def _inputs(max_tokens: int) -> list[grpcclient.InferInput]:
    prompt = f"{next(_serial)}. {BASE_PROMPT}"
    values = {
        "text_input": np.array([prompt.encode()], dtype=np.object_),
        "stream": np.array([True]),
        "return_num_output_tokens": np.array([True]),
        "sampling_parameters": np.array(
            [json.dumps({"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}).encode()],
            dtype=np.object_,
        ),
    }
    inputs = []
    for name, array in values.items():
        tensor = grpcclient.InferInput(
            name, list(array.shape), "BOOL" if array.dtype == np.bool_ else "BYTES"
        )
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _request(
    client: grpcclient.InferenceServerClient, events: queue.Queue, model: str, max_tokens: int
) -> Sample:
    """Send one request on the open stream and wait for its final response.

    TTFT is the arrival of the first response that carried a token; the tokens are
    the sum of every response's ``num_output_tokens``.
    """
    inputs = _inputs(max_tokens)
    start = time.perf_counter()
    first = None
    tokens = 0
    client.async_stream_infer(model, inputs, enable_empty_final_response=True)
    while True:
        result, error = events.get(timeout=600)
        now = time.perf_counter()
        if error is not None:
            return Sample((first or now) - start, now - start, False, str(error)[:300], tokens)
        counts = result.as_numpy("num_output_tokens")
        arrived = int(counts.sum()) if counts is not None else 0
        if first is None and arrived:
            first = now
        tokens += arrived
        if result.get_response().parameters["triton_final_response"].bool_param:
            short = tokens < max_tokens
            return Sample((first or now) - start, now - start, True, None, tokens, short)


def _worker(url: str, model: str, count: int, max_tokens: int, out: list[Sample]) -> None:
    """One client stream sending ``count`` requests back to back.

    A broken stream (no server, time-out, client exception) ends the worker with its
    unsent requests counted as failed: an exception in a thread would only vanish.
    """
    sent = 0
    events: queue.Queue = queue.Queue()
    try:
        client = grpcclient.InferenceServerClient(url)
        client.start_stream(callback=lambda result, error: events.put((result, error)))
        try:
            while sent < count:
                out.append(_request(client, events, model, max_tokens))
                sent += 1
        finally:
            client.stop_stream()
            client.close()
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"[:300]
        out.extend(Sample(0.0, 0.0, False, why) for _ in range(count - sent))


def measure(url: str, model: str, concurrency: int, per_worker: int, max_tokens: int) -> Point:
    samples: list[Sample] = []
    threads = [
        threading.Thread(target=_worker, args=(url, model, per_worker, max_tokens, samples))
        for _ in range(concurrency)
    ]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    good = [s for s in samples if s.ok]
    arrived = sum(s.tokens for s in samples)  # a failed request's tokens arrived, too
    if not good:
        error = next((s.error for s in samples if s.error), "no request was sent")
        return Point(
            model,
            concurrency,
            len(samples),
            len(samples),
            None,
            None,
            None,
            arrived / wall,
            error,
            output_tokens=arrived,
        )
    ttfts = sorted(s.ttft_s for s in good)
    return Point(
        model=model,
        concurrency=concurrency,
        requests=len(samples),
        errors=len(samples) - len(good),
        ttft_p50_ms=1000 * statistics.median(ttfts),
        ttft_p90_ms=1000 * ttfts[int(0.9 * (len(ttfts) - 1))],
        e2e_p50_ms=1000 * statistics.median(s.e2e_s for s in good),
        output_tok_s=arrived / wall,
        short=sum(s.short for s in good),
        output_tokens=arrived,
    )


def _ms(value: float | None, digits: int) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def report(points: list[Point], env: Environment, settings: dict) -> str:
    lines = [
        "# Pipelines: ensemble_vllm vs vllm_model vs ensemble_vllm_py",
        "",
        f"Settings: {json.dumps(settings)}",
        "",
        f"Machine: {describe_machine(env.machine)}.",
        "",
        f"Versions: {env.tritonserver}, "
        + ", ".join(f"{k} {v}" for k, v in env.serving_versions.items())
        + f", git commit {env.git_commit[:12]}"
        + (" (dirty)" if env.git_dirty else ""),
        "",
        "| model | concurrency | requests | errors | short | TTFT p50 ms | TTFT p90 ms "
        "| e2e p50 ms | output tok/s (arrived) | TTFT p50 vs direct |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    direct = {p.concurrency: p for p in points if p.model == "vllm_model"}
    for p in sorted(points, key=lambda p: (p.concurrency, MODELS.index(p.model))):
        if p.error is not None:
            lines.append(
                f"| {p.model} | {p.concurrency} | {p.requests} | {p.errors} | {p.short} "
                f"| failed: {p.error.splitlines()[0]} |||||"
            )
            continue
        base = direct.get(p.concurrency)
        delta = ""
        if base is not None and base.ttft_p50_ms and p.ttft_p50_ms is not None:
            delta = f"{100 * (p.ttft_p50_ms / base.ttft_p50_ms - 1):+.1f} %"
        lines.append(
            f"| {p.model} | {p.concurrency} | {p.requests} | {p.errors} | {p.short} "
            f"| {_ms(p.ttft_p50_ms, 1)} | {_ms(p.ttft_p90_ms, 1)} | {_ms(p.e2e_p50_ms, 0)} "
            f"| {p.output_tok_s:.1f} | {delta} |"
        )
    return "\n".join(lines) + "\n"


def _median(values: list[float | None]) -> float | None:
    """Median of the rounds that have the value (a failed round has none)."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def merge(rounds: list[list[Point]]) -> list[Point]:
    """Median over rounds of each metric, per model and concurrency."""
    merged = []
    for key, group in itertools.groupby(
        sorted((p for r in rounds for p in r), key=lambda p: (p.model, p.concurrency)),
        key=lambda p: (p.model, p.concurrency),
    ):
        group = list(group)
        ttft_p50 = _median([p.ttft_p50_ms for p in group])
        merged.append(
            Point(
                model=key[0],
                concurrency=key[1],
                requests=sum(p.requests for p in group),
                errors=sum(p.errors for p in group),
                short=sum(p.short for p in group),
                output_tokens=sum(p.output_tokens for p in group),
                ttft_p50_ms=ttft_p50,
                ttft_p90_ms=_median([p.ttft_p90_ms for p in group]),
                e2e_p50_ms=_median([p.e2e_p50_ms for p in group]),
                output_tok_s=_median([p.output_tok_s for p in group if p.error is None]) or 0.0,
                error=None if ttft_p50 is not None else group[0].error,
            )
        )
    return merged


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (median)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--requests-per-worker",
        type=int,
        default=None,
        help="default: 6 at concurrency 1, 3 at 8, 2 at 32",
    )
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args()


def run_rounds(server: TritonServer, args: argparse.Namespace) -> list[list[Point]]:
    """A warm-up per model, then every concurrency of every model per round, the models'
    order reversed every other round."""
    for model in MODELS:  # warm-up: first requests pay one-time costs
        measure(server.grpc_url, model, 2, 2, args.max_tokens)
    rounds: list[list[Point]] = []
    for r in range(args.rounds):
        points = []
        for concurrency in args.concurrency:
            per = args.requests_per_worker or {1: 6, 8: 3}.get(concurrency, 2)
            for model in MODELS if r % 2 == 0 else reversed(MODELS):
                point = measure(server.grpc_url, model, concurrency, per, args.max_tokens)
                print(json.dumps(asdict(point)), flush=True)
                points.append(point)
        rounds.append(points)
    return rounds


def main() -> int:
    args = _arguments()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or REPO_ROOT / "perf" / "results" / "pipelines" / stamp
    out.mkdir(parents=True, exist_ok=True)
    env = capture(ensure_default_model(quiet=True))
    load_average = os.getloadavg()  # other work on the machine shows in the numbers' spread
    settings = {
        "max_tokens": args.max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "prompt_tokens_approx": 100,
        "rounds": args.rounds,
        "client": "tritonclient gRPC stream",
    }
    server = TritonServer.on_free_ports(
        models=list(SERVED),
        log_path=Path(tempfile.gettempdir()) / f"tritonforge-bench-pipelines-{stamp}.log",
    )
    server.start()
    try:
        server.wait_ready()
        env.tritonserver = tritonserver_version(server.http_url)
        rounds = run_rounds(server, args)
    finally:
        server.stop()
    merged = merge(rounds)
    record = {
        "environment": env.model_dump(mode="json"),
        "load_average_at_start": load_average,
        "settings": settings,
        "results": [asdict(p) for p in merged],
        "rounds": [[asdict(p) for p in r] for r in rounds],
    }
    (out / "results.json").write_text(json.dumps(record, indent=2))
    (out / "report.md").write_text(report(merged, env, settings))
    print(report(merged, env, settings))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
