"""The storm with a forced kill: ten minutes of everything at once, tritonserver SIGKILLed midway.

``python -m tritonforge.bench storm`` (``make storm``) starts ``make serve``'s launcher on
free ports with ``vllm_model`` and ``ensemble_vllm`` (and the ensemble's steps), and for
``minutes`` keeps ``concurrency`` clients sending requests back to back over every path
— Triton gRPC (streamed and not), HTTP ``/generate`` and ``/generate_stream``, and the
OpenAI API (streamed and not) — each with ``timeout_s`` (600 s) set, a share cancelled by
the client at a random moment and a share malformed (:mod:`.storm_requests`). Midway,
tritonserver is SIGKILLed (what a segfault does) under the launcher's supervisor, and
the time until each path serves a real request again is measured while the storm goes on.

What must hold: every request ends — answered or errored, or cancelled by its client —
within its deadline (none hung, none lost); the server serves again with no operator
action, within the cold start of the same models + 30 s; the launcher and the OpenAI
frontend are the same processes throughout and their RSS is flat; nothing is left
running after the launcher's stop. Over the OpenAI API (:func:`carried_over`): of the
requests in flight at the kill that had sent their client nothing yet, at least 99 %
are answered after the restart; no client gets anything twice; the frontend's only
errors from the kill on are a passed deadline, its waiting room's limit and the restart
event of a stream that had sent tokens. Triton's own ports die with the server: their
requests in flight end with an error, counted by kind. The storm's crashes besides its
own kill (stub aborts, tritonserver crashes) come from the launcher's restart counter.
The foreign CPU share (:mod:`tritonforge.bench.noise`) says how much of the shared
machine other work took meanwhile.

The run writes ``perf/results/reliability/<UTC time>/storm.json`` and ``README.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import psutil

from tritonforge.bench import noise
from tritonforge.bench.environment import dirty_files
from tritonforge.bench.reliability.clients import Clients
from tritonforge.bench.reliability.crash_recovery import (
    MARGIN_S,
    Launcher,
    _restarts,
    time_to_serve,
)
from tritonforge.bench.reliability.models import ENSEMBLE, LLM
from tritonforge.bench.reliability.probes import command_line, shutdown_log, tree_rss
from tritonforge.bench.reliability.storm_requests import OPENAI_KINDS, Ended, draw, one_request
from tritonforge.launch.supervisor import STUB_DIED
from tritonforge.openai.triton_client import CHANNEL_ARGS
from tritonforge.paths import machine_free


@dataclass(frozen=True)
class StormSettings:
    """One storm's shape (every default is the committed run's)."""

    minutes: float = 10.0
    concurrency: int = 128
    models: tuple[str, ...] = (LLM, ENSEMBLE)
    cancel_share: float = 0.2
    cancel_within_s: float = 15.0  # a cancel comes 0 … this long after the request left
    malformed_share: float = 0.05
    timeout_s: float = 600.0
    kill_at_fraction: float = 0.5
    warmup_s: float = 60.0  # the RSS baseline is taken after this
    rss_limit_pct: float = 5.0
    seed: int = 0
    #: Of the OpenAI requests that had sent nothing at the kill, the share that must be
    #: answered after the restart.
    carried_target: float = 0.99


@dataclass
class StormState:
    """What the storm's tasks share while it runs."""

    launcher: Launcher
    settings: StormSettings
    started: float = field(default_factory=time.monotonic)
    records: list[Ended] = field(default_factory=list)
    sent: int = 0
    rss: list[dict[str, Any]] = field(default_factory=list)
    kill: dict[str, Any] = field(default_factory=dict)
    #: CPU snapshots at the storm's start, just before the kill, once serving again
    #: and at the end: the foreign CPU share is read per window, never across the kill
    #: (the killed processes' CPU leaves the run's account with them).
    cpu: dict[str, noise.CpuSnapshot] = field(default_factory=dict)

    def at(self) -> float:
        return round(time.monotonic() - self.started, 1)


def _rss(proc: psutil.Process | None) -> int | None:
    with contextlib.suppress(psutil.Error, AttributeError):
        return proc.memory_info().rss  # type: ignore[union-attr]
    return None


def _triton_group(launcher: Launcher) -> list[psutil.Process]:
    """The running tritonserver and its descendants ([] while it is down)."""
    with contextlib.suppress(ValueError, psutil.Error):
        server = launcher.triton()
        return [server, *server.children(recursive=True)]
    return []


async def sample_rss(
    state: StormState, frontend: psutil.Process, interval_s: float = 5.0, report_s: float = 30.0
) -> None:
    """Every ``interval_s``: the RSS of the launcher, the frontend and tritonserver's group,
    and a progress line every ``report_s``; until cancelled."""
    launcher = psutil.Process(state.launcher.process.pid)  # type: ignore[union-attr]
    last_report = 0.0
    while True:
        group, now = _triton_group(state.launcher), state.at()
        row: dict[str, Any] = {
            "t": now,
            "launcher": _rss(launcher),
            "frontend": _rss(frontend),
            "tritonserver_group": tree_rss(group)[0] if group else None,
        }
        state.rss.append(row)
        if now - last_report >= report_s:
            last_report = now
            states = Counter(r.state for r in state.records)
            print(f"storm {now:5.0f} s: {state.sent} sent, {dict(states)}", file=sys.stderr)
        await asyncio.sleep(interval_s)


def open_clients(launcher: Launcher, concurrency: int) -> Clients:
    """Connections for the storm: gRPC channels that reconnect within 2 s of a restart
    (the OpenAI frontend's settings), one HTTP pool for Triton's and the OpenAI API."""
    count = max(1, -(-concurrency // 16))
    channels = [
        grpc.aio.insecure_channel(launcher.server.grpc_url, options=CHANNEL_ARGS)
        for _ in range(count)
    ]
    connector = aiohttp.TCPConnector(limit=concurrency + 8)
    return Clients(launcher.server, channels, aiohttp.ClientSession(connector=connector))


async def run_workers(state: StormState, clients: Clients, end: float) -> None:
    """``concurrency`` clients sending back to back until ``end``; a client whose
    well-formed request errored waits a second before its next (as a client retrying
    would), so an outage is not a tight loop of refused connections."""
    s = state.settings
    serial = iter(range(10**9))

    async def worker(index: int) -> None:
        rng = random.Random(s.seed * 1_000_003 + index)
        while time.monotonic() < end:
            d = draw(rng, s.models, s.cancel_share, s.malformed_share, s.cancel_within_s)
            state.sent += 1
            url = state.launcher.openai_url
            ended = await one_request(clients, url, d, next(serial), s.timeout_s)
            state.records.append(ended)
            if ended.state == "errored" and d.malformed is None:
                await asyncio.sleep(1.0)

    await asyncio.gather(*(worker(i) for i in range(s.concurrency)))


async def kill_midway(state: StormState, at_s: float, timeout_s: float) -> None:
    """At ``at_s`` into the storm, SIGKILL tritonserver; then time each path's return.

    A kill that could not be done (no single tritonserver found) is recorded, not
    raised: the storm's counts still stand, and the verdict says the kill is missing.
    """
    await asyncio.sleep(max(0.0, at_s - (time.monotonic() - state.started)))
    launcher = state.launcher
    try:
        dead = launcher.triton()
        group = [dead, *dead.children(recursive=True)]
    except (ValueError, psutil.Error) as error:
        state.kill = {"error": f"no tritonserver to kill: {error!r}"}
        return
    state.cpu["before_kill"] = noise.snapshot()
    killed = time.monotonic()
    dead.kill()
    state.kill = {"killed_at": killed, "killed_at_s": state.at(), "killed_processes": len(group)}
    recovery = await time_to_serve(launcher, LLM, killed, timeout_s, poll_s=0.5)
    state.cpu["serving_again"] = noise.snapshot()
    state.kill |= {
        "recovery": recovery,
        "serving_again_at_s": state.at(),
        "restarts_by_cause": await asyncio.to_thread(_restarts, launcher),
        "launcher_recovery_s": await asyncio.to_thread(launcher_recovery_s, launcher),
        "dead_group_left": [
            f"{p.pid} {command_line(p)}"
            for p in group
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        ],
    }


def launcher_recovery_s(launcher: Launcher) -> float | None:
    """The launcher's own account: seconds from the death to the restarted server being
    ready with its models (``tritonforge_tritonserver_last_recovery_seconds``)."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(launcher.launcher_metrics_url, timeout=10).text
    for family in text_string_to_metric_families(text):
        if family.name == "tritonforge_tritonserver_last_recovery_seconds":
            return round(family.samples[0].value, 2) if family.samples else None
    return None


def first_answers(state: StormState) -> dict[str, float | None]:
    """Seconds from the kill until the first request sent after it was answered, per
    path: when the storm's own clients were served again (queueing behind the others
    included, as any client's would be)."""
    killed = state.kill.get("killed_at")
    found: dict[str, float | None] = {}
    for path in ("grpc", "http", "openai"):
        ends = [
            r.ended - killed
            for r in state.records
            if killed is not None and r.kind.startswith(path) and r.started > killed
            if r.state == "answered" and r.malformed is None
        ]
        found[path] = round(min(ends), 2) if ends else None
    return found


def foreign_cpu(state: StormState) -> dict[str, Any]:
    """The foreign CPU share before the kill and after serving again (the outage between
    is left out: the killed processes' CPU leaves the run's account when they die)."""
    cpu, shares = state.cpu, {}
    for name, start, end in (
        ("before_kill", "start", "before_kill"),
        ("after_serving_again", "serving_again", "end"),
    ):
        if start in cpu and end in cpu:
            shares[name] = {
                "share": round(noise.foreign_share(cpu[start], cpu[end]), 3),
                "busiest_others": noise.busiest_foreign(cpu[start], cpu[end]),
                "seconds": round(cpu[end].at - cpu[start].at, 1),
            }
    return shares


async def storm(state: StormState, frontend: psutil.Process) -> dict[str, Any]:
    """The storm on a ready launcher: load, the kill midway, then every request's end."""
    s = state.settings
    duration = 60 * s.minutes
    clients = open_clients(state.launcher, s.concurrency)
    sampler = asyncio.create_task(sample_rss(state, frontend))
    killer = asyncio.create_task(kill_midway(state, duration * s.kill_at_fraction, 900.0))
    state.cpu["start"] = noise.snapshot()
    load_1m = os.getloadavg()[0]
    try:
        await run_workers(state, clients, time.monotonic() + duration)
        await killer
    finally:
        state.cpu["end"] = noise.snapshot()
        sampler.cancel()
        killer.cancel()
        await asyncio.gather(sampler, killer, return_exceptions=True)
        await clients.close()
    return {
        "wall_s": state.at(),
        "load_1m_at_start": load_1m,
        "load_1m_at_end": os.getloadavg()[0],
        "foreign_cpu": foreign_cpu(state),
    }


def counts(state: StormState) -> dict[str, Any]:
    """Requests by how they ended, errors by kind and by phase (before the kill, in the
    outage — until the launcher had the server ready again —, after it), and the longest
    a request took."""
    kill = state.kill
    killed_at = kill.get("killed_at", float("inf"))
    back_at = killed_at + (kill.get("launcher_recovery_s") or 0.0)

    def phase(r: Ended) -> str:
        return "before_kill" if r.ended < killed_at else "outage" if r.ended <= back_at else "after"

    records = state.records
    errors = Counter(f"{phase(r)} | {r.error_kind}" for r in records if r.state == "errored")
    malformed = [r for r in records if r.malformed is not None]
    return {
        "sent": state.sent,
        "ended": len(records),
        "lost": state.sent - len(records),
        "by_state": dict(Counter(r.state for r in records)),
        "by_kind_and_state": dict(
            sorted(Counter(f"{r.kind} {r.model} {r.state}" for r in records).items())
        ),
        "errors_by_phase_and_kind": dict(sorted(errors.items())),
        "malformed": dict(Counter(r.error_kind or r.state for r in malformed)),
        "over_deadline": sum(r.seconds > state.settings.timeout_s for r in records),
        "longest_s": round(max((r.seconds for r in records), default=0.0), 2),
    }


#: What the OpenAI frontend may answer from the kill on (its error messages,
#: tritonforge/openai/carry_over.py): a deadline that passed while the request waited, its
#: waiting room full, and a stream that had sent tokens ended by the restart.
ALLOWED_RESTART_ERRORS = {
    "deadline passed": "tritonserver restarted (it stopped",
    "waiting room full": "Triton is restarting and",
    "started stream ended": "stream error tritonserver restarted after this",
}


def restart_error(kind: str) -> str | None:
    """Which allowed restart error an error kind is (None: another error)."""
    return next((name for name, words in ALLOWED_RESTART_ERRORS.items() if words in kind), None)


def carried_over(state: StormState) -> dict[str, Any]:
    """The OpenAI API across the kill: how the well-formed requests in flight at the kill
    ended — those whose client had nothing yet (to be carried over) apart from streams
    that had sent tokens —, answers given twice, and the errors from the kill on that
    are not a passed deadline, the waiting room's limit or a started stream's end."""
    killed_at = state.kill.get("killed_at")
    openai = [r for r in state.records if r.kind in OPENAI_KINDS and r.malformed is None]
    if killed_at is None:
        return {"killed": False, "duplicated": sum(r.duplicated for r in openai)}
    in_flight = [r for r in openai if r.started < killed_at < r.ended]
    nothing_yet = [r for r in in_flight if r.first_at is None or r.first_at > killed_at]
    started = [r for r in in_flight if r not in nothing_yet]
    judged = [r for r in nothing_yet if r.state != "cancelled"]  # the client's own cancel
    answered = sum(r.state == "answered" for r in judged)
    after_kill = [r for r in openai if r.ended > killed_at and r.state == "errored"]
    other = Counter(r.error_kind for r in after_kill if restart_error(r.error_kind) is None)
    allowed = Counter(name for r in after_kill if (name := restart_error(r.error_kind)) is not None)
    return {
        "killed": True,
        "in_flight_at_kill": len(in_flight),
        "nothing_sent_at_kill": {
            "count": len(nothing_yet),
            "by_kind": dict(Counter(r.kind for r in nothing_yet)),
            "by_state": dict(Counter(r.state for r in nothing_yet)),
            "errors": dict(Counter(r.error_kind for r in judged if r.state == "errored")),
            "answered_share": round(answered / len(judged), 4) if judged else None,
        },
        "streams_started_at_kill": {
            "count": len(started),
            "by_state": dict(Counter(r.state for r in started)),
            "ended_by_the_restart_event": sum(
                restart_error(r.error_kind) == "started stream ended" for r in started
            ),
        },
        "duplicated": sum(r.duplicated for r in openai),
        "errors_from_the_kill_on": {"allowed": dict(allowed), "other": dict(other)},
    }


def _growth_pct(series: list[tuple[float, int]], start_s: float, end_s: float) -> float | None:
    """RSS growth from the first sample at or after ``start_s`` to the last before
    ``end_s`` (None: no such pair)."""
    inside = [x for x in series if start_s <= x[0] < end_s]
    if len(inside) < 2:
        return None
    return round(100.0 * (inside[-1][1] - inside[0][1]) / inside[0][1], 2)


def rss_figures(state: StormState) -> dict[str, Any]:
    """Each surviving process's RSS after the warm-up and at the end of the load, and
    its growth; tritonserver's group for the record (it is the process that dies).

    A leak is judged per window — from the warm-up to the kill, and from a warm-up
    after serving again to the end — as the foreign CPU share is: during the outage the
    frontend holds every request waiting for the restarted server (up to the storm's
    concurrency at once), a step its allocator keeps but that does not grow after."""
    end_s = 60 * state.settings.minutes
    killed_s = state.kill.get("killed_at_s")
    back_s = state.kill.get("serving_again_at_s")
    rows = [r for r in state.rss if r["t"] <= end_s + 5]
    figures: dict[str, Any] = {}
    for name in ("launcher", "frontend", "tritonserver_group"):
        series = [(r["t"], r[name]) for r in rows if r[name] is not None]
        if not series:
            continue
        warm = next((x for x in series if x[0] >= state.settings.warmup_s), series[-1])
        first, last = series[0], series[-1]
        figures[name] = {
            "start_bytes": first[1],
            "after_warmup_bytes": warm[1],
            "end_bytes": last[1],
            "max_bytes": max(x[1] for x in series),
            "growth_after_warmup_pct": round(100.0 * (last[1] - warm[1]) / warm[1], 2),
            "window_s": [warm[0], last[0]],
        }
        if killed_s is not None and back_s is not None:
            windows = {
                "before_kill": _growth_pct(series, state.settings.warmup_s, killed_s),
                "after_serving_again": _growth_pct(
                    series, back_s + state.settings.warmup_s, end_s + 5.1
                ),
            }
            figures[name]["growth_in_windows_pct"] = windows
            judged = [g for g in windows.values() if g is not None]
            figures[name]["growth_judged_pct"] = max(judged) if len(judged) == 2 else None
    return figures


def everything(launcher: Launcher) -> list[psutil.Process]:
    """The launcher and every process under it: what its stop must leave none of."""
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(launcher.process.pid)  # type: ignore[union-attr]
        return [root, *root.children(recursive=True)]
    return []


def left_running(processes: list[psutil.Process], grace_s: float = 10.0) -> list[str]:
    """Those of ``processes`` still alive ``grace_s`` after the stop."""
    deadline = time.monotonic() + grace_s
    while True:
        alive = []
        for proc in processes:
            with contextlib.suppress(psutil.Error):
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{proc.pid} {command_line(proc)}")
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


def verdict(figures: dict[str, Any], s: StormSettings) -> list[str]:
    """What missed the storm's targets."""
    c, kill, failures = figures["counts"], figures["kill"], []
    if c["by_state"].get("hung", 0):
        failures.append(f"{c['by_state']['hung']} request(s) hung")
    if c["lost"]:
        failures.append(f"{c['lost']} request(s) lost (sent, never ended)")
    if c["over_deadline"]:
        failures.append(f"{c['over_deadline']} request(s) took longer than {s.timeout_s:g} s")
    ready, cold = kill.get("launcher_recovery_s"), figures["ready_line_s"]
    if "recovery" not in kill:
        failures.append(
            f"tritonserver was not killed: {kill.get('error', 'the storm ended first')}"
        )
    elif ready is None or ready > cold + MARGIN_S:
        failures.append(f"ready again after {ready} s, cold start {cold} s (+ {MARGIN_S:g} s)")
    for path, back in kill.get("recovery", {}).get("seconds", {}).items():
        if back is None:
            failures.append(f"{path}: never answered a probe after the kill")
    for name in ("launcher", "frontend"):
        if not figures["same_process"][name]:
            failures.append(f"the {name} process changed")
        rss = figures["rss"].get(name, {})
        growth = rss.get("growth_judged_pct", rss.get("growth_after_warmup_pct"))
        if growth is None or growth >= s.rss_limit_pct:
            failures.append(f"{name} RSS grew {growth} % after the warm-up")
    if figures["left_after_stop"]:
        failures.append(f"left running after the stop: {figures['left_after_stop'][:5]}")
    carried = figures.get("carried_over")
    if carried is not None and carried.get("killed"):
        share = carried["nothing_sent_at_kill"]["answered_share"]
        if share is None:
            failures.append("no OpenAI request was in flight with nothing sent at the kill")
        elif share < s.carried_target:
            failures.append(
                f"{share:.1%} of the OpenAI requests that had sent nothing at the kill were "
                f"answered after the restart (target {s.carried_target:.0%})"
            )
        if carried["duplicated"]:
            failures.append(f"{carried['duplicated']} OpenAI answer(s) given twice")
        other = carried["errors_from_the_kill_on"]["other"]
        if other:
            failures.append(f"OpenAI errors from the kill on besides the restart's: {other}")
    return failures


def _folded(lines: list[str], marker: str, whole: bool = False) -> dict[str, int]:
    """Lines holding ``marker`` — from it on, or ``whole`` messages (past the log's
    time and source) — numbers folded, counted."""
    found: Counter[str] = Counter()
    for line in lines:
        if marker in line:
            start = line.find("] ") + 2 if whole else line.index(marker)
            found[re.sub(r"[0-9]+", "N", machine_free(line[start:]))[:200]] += 1
    return dict(found.most_common(10))


#: What a crashing model stub leaves in the server's log (glibc's and CPython's aborts).
ABORT_MARKERS = ("corrupted", "double free", "free(): ", "Fatal Python error", "Aborted")


def crashes(restarts_at_end: dict[str, float], killed: bool, abort_lines: int) -> dict[str, Any]:
    """The crashes of the whole storm besides its own SIGKILL, from the launcher's restart
    counter at the end: a model stub's death (the launcher ends the server for it) and
    tritonserver's own exits; with the log's abort lines for the record."""
    causes = {k: int(v) for k, v in restarts_at_end.items() if v}
    if killed and causes.get("SIGKILL"):
        causes["SIGKILL"] -= 1  # the storm's own
    causes = {k: v for k, v in causes.items() if v}
    return {
        "stub_aborts": causes.get(STUB_DIED, 0),
        "tritonserver_crashes": sum(v for k, v in causes.items() if k != STUB_DIED),
        "restarts_by_cause_besides_the_kill": causes,
        "abort_lines_in_log": abort_lines,
    }


def logs(log_dir: Path) -> dict[str, Any]:
    """What the logs add: the launcher's own lines (exit causes, restarts), the server's
    from the final SIGTERM on, its count of stubs that saw the kill, and what the models'
    response threads could not send (a request whose FINAL is lost keeps its caller —
    an ensemble — counting it in flight).

    tritonserver writes to the launcher's stdout and stderr both (the launcher passes its
    own on): :func:`measure` sends both to ``launcher.log``; a ``server.log`` beside it is
    read too.
    """
    launcher_log = log_dir / "launcher.log"
    server_log = log_dir / "server.log"
    texts = [p.read_text(errors="replace") for p in (launcher_log, server_log) if p.exists()]
    lines = "\n".join(texts).splitlines()
    shutdown = shutdown_log(launcher_log, limit=60) or shutdown_log(server_log, limit=60)
    return {
        "launcher_lines": [machine_free(x) for x in lines if x.startswith("tritonforge:")],
        "non_graceful_terminations": sum("Non-graceful termination detected" in x for x in lines),
        "abort_lines": sum(any(m in x for m in ABORT_MARKERS) for x in lines),
        "response_thread_errors": _folded(lines, "[tritonforge] response thread:"),
        "in_flight_at_shutdown": _folded(lines, "in-flight inferences", whole=True),
        "server_after_sigterm": [machine_free(x) for x in shutdown],
    }


def measure(settings: StormSettings, log_dir: Path) -> dict[str, Any]:
    """Start the launcher, time its cold start, storm it, stop it; every figure."""
    from tritonforge.bench.environment import tritonserver_version
    from tritonforge.bench.reliability.models import models_to_load

    models = models_to_load(settings.models)
    log = log_dir / "launcher.log"  # stdout and stderr in one file, in the order written
    launcher = Launcher(models, log, stdout_log=log)
    launcher.start()
    state, figures = StormState(launcher, settings), dict[str, Any]()
    try:
        launcher.wait_ready(900.0)
        figures["ready_line_s"] = round(time.monotonic() - launcher.started_at, 2)
        figures["tritonserver"] = tritonserver_version(launcher.server.http_url)
        figures["cold_start"] = asyncio.run(time_to_serve(launcher, LLM, launcher.started_at, 900))
        frontend = launcher.frontend()
        state.started = time.monotonic()
        figures["load"] = asyncio.run(storm(state, frontend))
        figures["same_process"] = {
            "launcher": launcher.process.poll() is None,  # type: ignore[union-attr]
            "frontend": launcher.frontend().pid == frontend.pid,
        }
        figures["restarts_at_end"] = _restarts(launcher)
    finally:
        processes = everything(launcher)
        figures["launcher_exit_code"] = launcher.stop(timeout_s=120.0)
    figures["left_after_stop"] = left_running(processes)
    figures["loaded_models"] = models
    figures["counts"] = counts(state)
    figures["carried_over"] = carried_over(state)
    figures["kill"] = {k: v for k, v in state.kill.items() if k != "killed_at"}
    figures["kill"]["first_answer_after_kill_s"] = first_answers(state)
    figures["rss"] = rss_figures(state)
    figures["rss_samples"] = state.rss
    found = logs(log_dir)
    figures["crashes"] = crashes(
        figures.get("restarts_at_end", {}), "recovery" in state.kill, found["abort_lines"]
    )
    return figures | {"logs": found}


def _mib(value: Any) -> str:
    return f"{value / 2**20:.1f} MiB" if isinstance(value, int | float) else "–"


def _table(title: str, rows: dict[str, Any]) -> list[str]:
    return [f"| {title} | count |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows.items()), ""]


_RSS_NAMES = {
    "tritonserver_group": "tritonserver's group (for the record: the killed server at the "
    "start, the restarted one at the end)"
}


def _carried_lines(carried: dict[str, Any] | None) -> list[str]:
    """The OpenAI API across the kill, for the summary."""
    if not carried or not carried.get("killed"):
        return []
    nothing, started = carried["nothing_sent_at_kill"], carried["streams_started_at_kill"]
    share = nothing["answered_share"]
    errors = carried["errors_from_the_kill_on"]
    return [
        f"- OpenAI requests in flight at the kill: {carried['in_flight_at_kill']}; of the "
        f"{nothing['count']} that had sent their client nothing yet ({nothing['by_kind']}): "
        f"{nothing['by_state']}, **answered after the restart: "
        f"{'–' if share is None else f'{share:.1%}'}** (the client's own cancels left out; "
        f"errors: {nothing['errors'] or 'none'})",
        f"- OpenAI streams that had sent tokens at the kill: {started['count']} "
        f"({started['by_state']}), {started['ended_by_the_restart_event']} ended by the "
        f"restart's error event; **answers given twice: {carried['duplicated']}**",
        f"- OpenAI errors from the kill on: the restart's own {errors['allowed'] or 'none'}; "
        f"**any other: {errors['other'] or 'none'}**",
    ]


def _crash_lines(found: dict[str, Any] | None) -> list[str]:
    if not found:
        return []
    return [
        f"- crashes besides the storm's SIGKILL (the launcher's restart counter at the end): "
        f"**stub aborts {found['stub_aborts']}, tritonserver crashes "
        f"{found['tritonserver_crashes']}** ({found['restarts_by_cause_besides_the_kill']}); "
        f"abort lines in the log: {found['abort_lines_in_log']}"
    ]


def _summary(result: dict[str, Any]) -> list[str]:
    """The run's settings and its figures, one line each, failures first."""
    f, s = result["figures"], result["settings"]
    c, kill, load = f["counts"], f["kill"], f["load"]
    recovery = kill.get("recovery", {})
    return [
        f"{s['minutes']:g} min at concurrency {s['concurrency']} over "
        f"{', '.join(s['models'])} (Triton gRPC, HTTP and the OpenAI API), every request with "
        f"`timeout_s` {s['timeout_s']:g}; {s['cancel_share']:.0%} cancelled by the client "
        f"0–{s['cancel_within_s']:g} s after sending, {s['malformed_share']:.0%} malformed; "
        f"tritonserver SIGKILLed {kill.get('killed_at_s')} s in, under the launcher. Seed "
        f"{s['seed']}.",
        "",
        *(f"- **failed**: {x}" for x in result["failures"]),
        f"- requests sent {c['sent']}, ended {c['ended']}: {c['by_state']}; **hung "
        f"{c['by_state'].get('hung', 0)}, lost {c['lost']}**; longest {c['longest_s']} s "
        f"(deadline {s['timeout_s']:g} s)",
        f"- **ready again {kill.get('launcher_recovery_s')} s after the SIGKILL** (the "
        f"launcher's account: restarted, models loaded; its cold start took "
        f"{f['ready_line_s']} s to the ready line); a probe answered per path after (s): "
        f"{recovery.get('seconds')}; the storm's first request sent after the kill "
        f"answered after (s): {kill.get('first_answer_after_kill_s')}; unloaded cold start "
        f"per path (s, from the launcher's start): {f['cold_start']['seconds']}",
        f"- OpenAI answers to the recovery probe while Triton was down: "
        f"{recovery.get('openai_statuses')}",
        *_carried_lines(f.get("carried_over")),
        *_crash_lines(f.get("crashes")),
        f"- launcher's restart counter: {kill.get('restarts_by_cause')}; same launcher and "
        f"frontend processes: {f['same_process']}",
        *(
            f"- RSS {_RSS_NAMES.get(name, name)}: {_mib(r['start_bytes'])} at start, "
            f"{_mib(r['after_warmup_bytes'])} "
            f"after warm-up, {_mib(r['end_bytes'])} at the end ({r['growth_after_warmup_pct']:+} "
            f"%), max {_mib(r['max_bytes'])}"
            + (
                f"; growth judged per window (%): {r['growth_in_windows_pct']}"
                if "growth_in_windows_pct" in r
                else ""
            )
            for name, r in f["rss"].items()
        ),
        f"- processes left after the stop: {len(f['left_after_stop'])}; launcher exit code "
        f"{f['launcher_exit_code']}",
        *(
            f"- machine, {name.replace('_', ' ')} ({w['seconds']} s): foreign CPU share "
            f"{w['share']:.0%} (busiest others: {', '.join(w['busiest_others']) or 'none'})"
            for name, w in load["foreign_cpu"].items()
        ),
        f"- load average {load['load_1m_at_start']:.1f} at the start, "
        f"{load['load_1m_at_end']:.1f} at the end; uncommitted files in the tree at launch: "
        f"{', '.join(result.get('dirty_files', [])) or 'none'}",
        "",
    ]


def report(result: dict[str, Any]) -> str:
    """README.md of a run: the verdict, the counts, the kill and recovery, memory, noise."""
    from tritonforge.bench.environment import Environment, describe_code, describe_machine

    f, c = result["figures"], result["figures"]["counts"]
    env = Environment.model_validate(result["environment"])
    verdict_word = "PASS" if not result["failures"] else "FAIL"
    stubs = f["logs"]["non_graceful_terminations"]
    lines = [
        f"# Storm with a forced kill ({result['started_utc']}): {verdict_word}",
        "",
        f"`{result['command']}`",
        "",
        *_summary(result),
        *_table("errors (phase | kind)", c["errors_by_phase_and_kind"]),
        *_table("malformed requests ended as", c["malformed"]),
        *_table("kind, model, end", c["by_kind_and_state"]),
        *_table("models' response threads could not send", f["logs"]["response_thread_errors"]),
        *_table("in flight at shutdown (server log)", f["logs"]["in_flight_at_shutdown"]),
        "Launcher log:",
        "",
        "```",
        *f["logs"]["launcher_lines"],
        "```",
        "",
        f"tritonserver's log from the launcher's SIGTERM on ({stubs} stub(s) logged a "
        "non-graceful termination after the kill):",
        "",
        "```",
        *f["logs"]["server_after_sigterm"],
        "```",
        "",
        f"Machine: {describe_machine(env.machine)}.",
        f"Code: {describe_code(env)}. Server: {env.tritonserver}.",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in env.serving_versions.items()) + ".",
        "",
    ]
    return "\n".join(lines)


#: The settings the command line may set (``python -m tritonforge.bench storm --help``).
_OPTIONS = (
    "minutes",
    "concurrency",
    "models",
    "cancel_share",
    "malformed_share",
    "timeout_s",
    "seed",
)


def main(args: Any, command: Callable[[], str]) -> int:
    """Run the storm and write ``storm.json`` and ``README.md``; 0 if it passed."""
    from tritonforge.bench.environment import capture, served_code
    from tritonforge.bench.soak import RESULTS_ROOT
    from tritonforge.launch.model_store import ensure_default_model

    given = {name: getattr(args, name, None) for name in _OPTIONS}
    if given["models"] is not None:
        given["models"] = tuple(given["models"])
    settings = StormSettings(**{k: v for k, v in given.items() if v is not None})
    code = served_code(allow_mismatch=getattr(args, "allow_served_mismatch", False))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.results or RESULTS_ROOT) / stamp
    env = capture(ensure_default_model(quiet=True), code)
    dirty = dirty_files()
    with tempfile.TemporaryDirectory(prefix="tritonforge-storm-") as log_dir:
        figures = measure(settings, Path(log_dir))
    env.tritonserver = figures.pop("tritonserver", "")
    result = {
        "started_utc": stamp,
        "command": command(),
        "dirty_files": dirty,
        "settings": asdict(settings),
        "figures": figures,
        "failures": verdict(figures, settings),
        "environment": env.model_dump(),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "storm.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "README.md").write_text(report(result))
    print(out / "README.md")
    return 0 if not result["failures"] else 1
