"""SIGTERM under load: a busy server told to stop must end every request and leave nothing.

The signal goes to tritonserver itself, as a process supervisor or a container runtime
sends it, with long requests in flight that cannot finish within the exit timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import time
from collections.abc import Sequence
from typing import Any

import psutil

from tritonforge.bench.reliability.clients import (
    Clients,
    GrpcStream,
    Outcome,
    grpc_request,
    http_generate,
)
from tritonforge.bench.reliability.mixed_load import PROMPTS
from tritonforge.bench.reliability.models import LLM
from tritonforge.bench.reliability.probes import (
    command_line,
    in_engine,
    shutdown_log,
    wait_metrics,
)
from tritonforge.bench.reliability.verdict import Scenario, judged


def long_requests(
    clients: Clients,
    models: Sequence[str],
    requests: int,
    transports: Sequence[str],
    max_tokens: int,
) -> list[asyncio.Task]:
    """Start ``requests`` requests of ``max_tokens`` forced tokens, alternating the models
    and, in pairs of models, gRPC streams and HTTP ``/generate``."""
    rng = random.Random(15)
    tasks = []
    for i in range(requests):
        model = models[i % len(models)]
        sampling = {"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.8, "seed": i}
        prompt = f"Story {i}: {rng.choice(PROMPTS)}"
        if transports[(i // len(models)) % len(transports)] == "http":
            body = {"text_input": prompt, "sampling_parameters": json.dumps(sampling)}
            coro = http_generate(clients.session, clients.server, model, body, timeout_s=3600)
        else:
            inputs: dict[str, str | bytes | bool] = {
                "text_input": prompt,
                "sampling_parameters": json.dumps(sampling),
                "stream": True,
            }
            stream = GrpcStream(clients.channel(), grpc_request(model, inputs))
            coro = stream.run("grpc_stream", timeout_s=3600)
        tasks.append(asyncio.create_task(coro))
    return tasks


async def _terminate_and_wait(
    server: Any, tasks: list[asyncio.Task], bound_s: float, orphan_grace_s: float
) -> tuple[int | None, float, list[Outcome], int, list[psutil.Process], float]:
    """SIGTERM; then the exit code (None: still running), seconds to exit, the requests
    that ended, how many did not, the session's processes left after the grace, and the
    monotonic time of the signal."""
    from tritonforge.launch.launcher import session_processes

    leader = server.process.pid
    signalled = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    exit_code: int | None = None
    with contextlib.suppress(Exception):  # subprocess.TimeoutExpired: still running
        exit_code = await asyncio.to_thread(server.process.wait, bound_s)
    exited_after = time.monotonic() - signalled
    done, pending = await asyncio.wait(
        tasks, timeout=max(0.1, bound_s - (time.monotonic() - signalled))
    )
    # Still running: its processes are trivially "left"; no grace to wait out.
    deadline = time.monotonic() + (orphan_grace_s if exit_code is not None else 0.0)
    left = session_processes(leader)
    while left and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        left = session_processes(leader)
    return exit_code, exited_after, [t.result() for t in done], len(pending), left, signalled


def _failures(
    figures: dict[str, Any], requests: int, bound_s: float, orphan_grace_s: float
) -> list[str]:
    failures = []
    exit_code = figures["server_exit_code"]
    left = [p.split(" ", 1)[-1][:40] for p in figures["processes_left"]]  # "pid command"
    if not figures["all_reached_engine"]:
        failures.append(f"the load never all reached the engine: {figures['gauges_at_sigterm']}")
    if figures["hung"]:
        failures.append(
            f"{figures['hung']} of {requests} request(s) had no response and no error "
            f"{bound_s:.0f} s after SIGTERM"
        )
    if exit_code is None:
        failures.append(f"tritonserver still running {bound_s:.0f} s after SIGTERM")
    if left and exit_code is not None:
        failures.append(
            f"{len(left)} process(es) of the server's group alive {orphan_grace_s:g} s "
            f"after it exited: {', '.join(left)}"
        )
    elif left:
        failures.append(
            f"{len(left)} process(es) of the server's group still running (tritonserver "
            f"too), left for the caller's SIGKILL: {', '.join(left)}"
        )
    return failures


async def _measure_shutdown(
    clients: Clients,
    server: Any,
    tasks: list[asyncio.Task],
    engine_model: str,
    bound_s: float,
    orphan_grace_s: float,
) -> dict[str, Any]:
    """Once every request is in the engine, SIGTERM and what followed, as figures."""
    requests = len(tasks)
    admitted_after, at_signal = await wait_metrics(
        clients.session, server, engine_model, lambda m: in_engine(m) >= requests, 120, 0.2
    )
    figures: dict[str, Any] = {
        "in_engine_at_sigterm": in_engine(at_signal),
        "all_reached_engine": admitted_after is not None,
        "gauges_at_sigterm": at_signal,
        "processes_before": len(server.group_processes()),
    }
    exit_code, exited_after, outcomes, hung, left, signalled = await _terminate_and_wait(
        server, tasks, bound_s, orphan_grace_s
    )
    errored = [o for o in outcomes if not o.ok]
    ends = sorted(o.ended_at - signalled for o in outcomes)
    return figures | {
        "answered": len(outcomes) - len(errored),
        "errored": len(errored),
        "hung": hung,
        "first_end_after_sigterm_s": round(ends[0], 2) if ends else None,
        "last_end_after_sigterm_s": round(ends[-1], 2) if ends else None,
        "error_samples": sorted({(o.error or "")[:160] for o in errored})[:5],
        "server_exit_code": exit_code,
        "server_exited_after_s": round(exited_after, 2) if exit_code is not None else None,
        "processes_left": [f"{p.pid} {command_line(p)}" for p in left],
        "server_log_after_sigterm": shutdown_log(getattr(server, "log_path", None)),
    }


async def sigterm_under_load(
    server: Any,
    *,
    models: Sequence[str] = (LLM,),
    requests: int = 32,
    transports: Sequence[str] = ("grpc", "http"),
    max_tokens: int = 1024,
    exit_timeout_s: float = 30.0,
    margin_s: float = 30.0,
    orphan_grace_s: float = 10.0,
    engine_model: str = LLM,
) -> Scenario:
    """SIGTERM to tritonserver itself with ``requests`` long requests in flight.

    ``server`` is a started :class:`tritonforge.launch.launcher.TritonServer`; this scenario
    ends it, as a process supervisor or a container runtime would (``make serve``'s
    launcher adds a SIGKILL of whatever is left; this measures what is left for it).
    The requests alternate between the models and between gRPC streams and HTTP
    ``/generate``; ``max_tokens`` (with ``ignore_eos``) makes them outlast the exit
    timeout on a CPU, so what is measured is the shutdown of a busy server, not one
    that happened to drain in time; ``engine_model``'s gauges say when they are all in
    the engine. Passes when every request ended — a response or an error — within the
    server's exit timeout plus ``margin_s`` of the signal (none hung), tritonserver
    exited in that time too, and no process of its session (stubs, engine cores) was
    alive ``orphan_grace_s`` after it. The caller still calls ``server.stop()``, which
    kills leftovers — after this function has counted them.
    """
    started = time.monotonic()
    clients = Clients.open(server, requests)
    bound_s = exit_timeout_s + margin_s
    tasks: list[asyncio.Task] = []
    figures: dict[str, Any] = {
        "requests": requests,
        "models": list(models),
        "transports": list(transports),
        "max_tokens": max_tokens,
        "exit_timeout_s": exit_timeout_s,
    }
    failures: list[str] = []
    try:
        tasks += long_requests(clients, models, requests, transports, max_tokens)
        figures |= await _measure_shutdown(
            clients, server, tasks, engine_model, bound_s, orphan_grace_s
        )
        failures = _failures(figures, requests, bound_s, orphan_grace_s)
    finally:
        await clients.close(abandoned=tasks)
    criteria = [
        f"{requests} long requests in flight (gRPC streams and HTTP /generate) at "
        "SIGTERM to tritonserver",
        f"each gets a response or an error within {bound_s:.0f} s of the signal "
        f"(exit timeout {exit_timeout_s:g} s + {margin_s:g} s)",
        f"tritonserver exits within {bound_s:.0f} s",
        f"no process of its group alive {orphan_grace_s:g} s after it exited",
    ]
    return judged("sigterm_under_load", criteria, figures, failures, started)
