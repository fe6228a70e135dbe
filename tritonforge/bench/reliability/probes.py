"""What the scenarios watch besides their own requests: the server's metrics, memory,
processes and log.

Every figure that decides a verdict about the server's state comes from here: the
engine's own gauges and counters (``vllm:*`` on the metrics port), the process
group's memory, the processes left after a shutdown and the log of that shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from tritonforge.bench.reliability.clients import Server

RUNNING, WAITING, KV_USAGE = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
)
GAUGES = (RUNNING, WAITING, KV_USAGE)
OUTCOMES = "vllm:request_outcome_total"

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)$")


def parse_metric(
    text: str, name: str, model: str | None = None, labels: dict[str, str] | None = None
) -> float:
    """Sum of one Prometheus series' samples (those labelled ``model`` and ``labels``)."""
    wanted = dict(labels or {}) | ({"model": model} if model is not None else {})
    total = 0.0
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(found.get(key) == value for key, value in wanted.items()):
            total += float(match.group(3))
    return total


async def metrics_text(session: aiohttp.ClientSession, server: Server) -> str:
    async with session.get(server.metrics_url, timeout=aiohttp.ClientTimeout(10)) as reply:
        return await reply.text()


async def read_metrics(
    session: aiohttp.ClientSession, server: Server, names: Sequence[str], model: str
) -> dict[str, float]:
    text = await metrics_text(session, server)
    return {name: parse_metric(text, name, model) for name in names}


async def cancelled_total(session: aiohttp.ClientSession, server: Server, model: str) -> float:
    """Requests ``model``'s engine counted as cancelled so far."""
    text = await metrics_text(session, server)
    return parse_metric(text, OUTCOMES, model, {"outcome": "cancelled"})


async def wait_metrics(
    session: aiohttp.ClientSession,
    server: Server,
    model: str,
    predicate: Callable[[dict[str, float]], bool],
    timeout_s: float,
    interval_s: float = 0.05,
) -> tuple[float | None, dict[str, float]]:
    """Seconds until ``predicate`` held on ``model``'s gauges (None: not within ``timeout_s``)."""
    start = time.monotonic()
    while True:
        values = await read_metrics(session, server, (*GAUGES, OUTCOMES), model)
        if predicate(values):
            return time.monotonic() - start, values
        if time.monotonic() - start > timeout_s:
            return None, values
        await asyncio.sleep(interval_s)


def in_engine(metrics: dict[str, float]) -> float:
    """Requests the engine holds, running or waiting."""
    return metrics[RUNNING] + metrics[WAITING]


def tree_rss(processes: Sequence[psutil.Process]) -> tuple[int, int]:
    """(summed RSS in bytes, live process count) over the server's process group.

    RSS counts pages shared between processes once per process; the sum is still the
    right thing to watch for growth, since a leak in any process raises it.
    """
    total, alive = 0, 0
    for proc in processes:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
            alive += 1
    return total, alive


def command_line(proc: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return " ".join(proc.cmdline()).strip()[:120] or proc.name()
    return "?"


_COUNTDOWN = re.compile(r"Timeout \d+: Found \d+ (HTTP service connections|live models)")


def shutdown_log(path: Any, limit: int = 40) -> list[str]:
    """The server log from its SIGTERM on, the once-a-second countdown lines folded."""
    if path is None:
        return []
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return []
    marker = text.rfind("Signal (15) received")
    if marker < 0:
        return []
    lines, folded = [], 0
    for line in text[marker:].splitlines():
        if _COUNTDOWN.search(line):
            folded += 1
            continue
        if folded:
            lines.append(f"[{folded} countdown lines]")
            folded = 0
        lines.append(line.strip()[:200])
    if folded:
        lines.append(f"[{folded} countdown lines]")
    return lines[:limit]
