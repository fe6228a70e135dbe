"""Cancellation storm: long streams, all in the engine, cancelled at the same instant.

What must follow is the engine's own account: nothing running or waiting, the KV cache
back to its idle level, and every stream counted as cancelled — read from the engine's
gauges and counters on the metrics port, not from the clients.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp

from tritonforge.bench.reliability.clients import Clients, GrpcStream, Server, grpc_request
from tritonforge.bench.reliability.mixed_load import PROMPTS
from tritonforge.bench.reliability.models import LLM
from tritonforge.bench.reliability.probes import (
    KV_USAGE,
    RUNNING,
    WAITING,
    cancelled_total,
    in_engine,
    wait_metrics,
)
from tritonforge.bench.reliability.verdict import Scenario, judged


def engine_idle(metrics: dict[str, float]) -> bool:
    return metrics[RUNNING] == 0 and metrics[WAITING] == 0


def long_streams(clients: Clients, model: str, streams: int) -> list[GrpcStream]:
    """``streams`` gRPC streams of 512 forced tokens each, spread over the channels."""
    sampling = {"max_tokens": 512, "ignore_eos": True, "temperature": 0.8}
    calls = []
    for i in range(streams):
        inputs: dict[str, str | bytes | bool] = {
            "text_input": f"Story {i}: {PROMPTS[i % len(PROMPTS)]}",
            "sampling_parameters": json.dumps(sampling | {"seed": i}),
            "stream": True,
        }
        channel = clients.channels[i % len(clients.channels)]
        calls.append(GrpcStream(channel, grpc_request(model, inputs)))
    return calls


async def _cancel_all_and_watch(
    session: aiohttp.ClientSession,
    server: Server,
    model: str,
    calls: list[GrpcStream],
    tasks: list[asyncio.Task],
    baseline_kv: float,
    kv_within_s: float,
    failures: list[str],
) -> dict[str, Any]:
    """Wait until every stream is in the engine, cancel them all, time the engine's return."""
    streams = len(calls)
    admitted_after, at_cancel = await wait_metrics(
        session, server, model, lambda m: in_engine(m) >= streams, 120, 0.2
    )
    streaming = sum(c.first_response.is_set() for c in calls)
    if admitted_after is None:
        failures.append(f"only {in_engine(at_cancel):.0f} in the engine")
    cancel_at = time.monotonic()
    for call in calls:
        call.call.cancel()
    idle_after, after = await wait_metrics(session, server, model, engine_idle, 30)
    kv_after, kv = await wait_metrics(
        session, server, model, lambda m: m[KV_USAGE] <= baseline_kv + 1e-9, kv_within_s
    )
    kv_s = None if kv_after is None else time.monotonic() - cancel_at
    await asyncio.wait(tasks, timeout=30)
    return {
        "admitted_before_cancel_s": admitted_after and round(admitted_after, 2),
        "running_at_cancel": at_cancel[RUNNING],
        "waiting_at_cancel": at_cancel[WAITING],
        "kv_usage_at_cancel": at_cancel[KV_USAGE],
        "streams_with_output_at_cancel": streaming,
        "idle_after_cancel_s": idle_after and round(idle_after, 3),
        "gauges_after_cancel": after,
        "kv_usage_baseline": baseline_kv,
        "kv_usage_after": kv[KV_USAGE],
        "kv_back_after_s": kv_s and round(kv_s, 3),
        "client_calls_ended": sum(t.done() for t in tasks),
    }


def _storm_failures(
    figures: dict[str, Any], streams: int, within_s: float, kv_within_s: float
) -> list[str]:
    failures = []
    idle_after, kv_s = figures["idle_after_cancel_s"], figures["kv_back_after_s"]
    if idle_after is None or idle_after > within_s:
        failures.append(
            f"running/waiting not 0 within {within_s:g} s: {figures['gauges_after_cancel']}"
        )
    if kv_s is None or kv_s > kv_within_s:
        failures.append(
            f"KV usage {figures['kv_usage_after']} not back to {figures['kv_usage_baseline']}"
        )
    if figures["counted_cancelled"] != streams:
        failures.append(f"{figures['counted_cancelled']:.0f} of {streams} counted")
    return failures


async def cancel_storm(
    server: Server,
    *,
    streams: int = 100,
    model: str = LLM,
    within_s: float = 2.0,
    kv_within_s: float = 5.0,
) -> Scenario:
    """``streams`` long gRPC streams to ``model``, all in its engine, cancelled at once.

    Passes when the engine's running and waiting gauges are both 0 within ``within_s``
    of the cancel, the KV-cache gauge is back to its idle baseline within ``kv_within_s``,
    and every stream counts as cancelled in ``request_outcome_total``.
    """
    started = time.monotonic()
    clients = Clients.open(server, streams, per_channel=25)
    tasks: list[asyncio.Task] = []
    figures: dict[str, Any] = {"streams": streams, "model": model}
    failures: list[str] = []
    try:
        idle_after, idle = await wait_metrics(clients.session, server, model, engine_idle, 120)
        if idle_after is None:
            failures.append(f"the engine was not idle before the storm: {idle}")
        cancelled_before = await cancelled_total(clients.session, server, model)
        calls = long_streams(clients, model, streams)
        tasks += [asyncio.create_task(c.run("cancelled_stream", timeout_s=180)) for c in calls]
        figures |= await _cancel_all_and_watch(
            clients.session, server, model, calls, tasks, idle[KV_USAGE], kv_within_s, failures
        )
        counted = await cancelled_total(clients.session, server, model) - cancelled_before
        figures["counted_cancelled"] = counted
        failures += _storm_failures(figures, streams, within_s, kv_within_s)
    finally:
        await clients.close(abandoned=tasks)
    criteria = [
        f"{streams} streams in the engine, cancelled at once",
        f"vllm:num_requests_running and _waiting back to 0 within {within_s:g} s",
        f"vllm:kv_cache_usage_perc back to its idle baseline within {kv_within_s:g} s",
        "every stream counted in request_outcome_total{outcome=cancelled}",
    ]
    return judged("cancel_storm", criteria, figures, failures, started)
