"""Does the OpenAI frontend's memory grow with the requests it serves? Tens of thousands
of the kill storm's kinds of request, an outage of Triton among them, and its RSS.

Why: the ten-minute storm (``python -m tritonforge.bench storm``) saw the frontend's RSS
rise 7 % after its warm-up, a sawtooth too short to tell allocator settling from a leak.
Here the model is the synthetic engine (``synthetic_model`` alone, paced faster), so a
request costs the frontend's work and little else, and one run sends ≥ 50k of them:
chat and completions, streamed and not, a share cancelled by the client (before the
first token, or mid-stream by closing the connection), a share malformed (bad JSON,
out-of-range sampling values, an unknown model), and ``--outages`` times tritonserver
SIGKILLed under load, the frontend answering 503 until a new server is up on the same
ports. The frontend's RSS is sampled every ``--sample-s``; at checkpoints the frontend
itself (started through this script's ``frontend`` mode: ``python -m tritonforge.openai``
plus a SIGUSR1 probe) runs a full collection and records its live objects by type, its
asyncio tasks and, with ``--tracemalloc``, an allocation snapshot.

    .venv/bin/python perf/frontend_rss.py --requests 60000 --outages 3
    .venv/bin/python perf/frontend_rss.py --requests 20000 --tracemalloc 8

Writes ``perf/results/frontend-rss/<UTC timestamp>/results.json`` and ``README.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gc
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402
import psutil  # noqa: E402

from tritonforge.bench.environment import (  # noqa: E402
    Environment,
    capture,
    describe_code,
    describe_machine,
    dirty_files,
    serving_versions,
    tritonserver_version,
)
from tritonforge.launch.launcher import (  # noqa: E402
    MODEL_REPOSITORY,
    TritonServer,
    free_port,
    free_ports,
    stop_session,
)
from tritonforge.launch.supervisor import remove_files, shm_regions  # noqa: E402
from tritonforge.paths import new_run_dir  # noqa: E402

MODEL = "synthetic_model"
PROBE_DIR_ENV = "FRONTEND_RSS_PROBES"
TRACE_ENV = "FRONTEND_RSS_TRACEMALLOC"
MiB = 2**20


# --- the frontend's side: python -m tritonforge.openai with a probe on SIGUSR1 ---------


def _statm_rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def pymalloc_stats() -> dict[str, int]:
    """Python's small-object allocator: its arenas now, and the bytes its live blocks hold
    (``sys._debugmallocstats`` writes them to the C stderr, read back here). Arenas held
    for few live bytes are fragmentation; RSS beyond the arenas is C memory."""
    wanted = {
        "# arenas allocated current": "arenas_current",
        "# bytes in allocated blocks": "bytes_in_blocks",
        "Total": "arena_bytes",  # the first Total: the arenas' (the next is the arena map's)
    }
    saved = os.dup(2)
    with tempfile.TemporaryFile() as out:
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")
    found = {}
    for line in text.splitlines():
        key, _, value = line.rpartition("=")
        if key.strip() in wanted and wanted[key.strip()] not in found:
            found[wanted[key.strip()]] = int(value.strip().replace(",", ""))
    return found


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                     "uordblks", "fordblks", "keepcost")
    ]  # fmt: skip


def malloc_in_use() -> dict[str, int]:
    """glibc's own account (``mallinfo2``, every arena): bytes handed out and not freed,
    and bytes free inside its heaps. In use growing is memory someone holds (a leak in C
    if Python's allocators are flat); free growing with RSS is fragmentation."""
    info = ctypes.CDLL("libc.so.6").mallinfo2
    info.restype = _MallInfo2
    got = info()
    return {"in_use_bytes": got.uordblks + got.hblkhd, "free_in_heaps_bytes": got.fordblks}


def probe(directory: Path) -> None:
    """One checkpoint, written as ``<n>.json`` (and ``<n>.snapshot`` when tracing): RSS
    before and after a full collection, the live gc-tracked objects by type, the asyncio
    tasks, and the traced allocations. A leak survives the collection; garbage waiting
    for one does not."""
    number = len(list(directory.glob("*.json")))
    before = _statm_rss()
    collected = gc.collect()
    live = gc.get_objects()
    types = Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in live)
    classes = Counter(f"{o.__module__}.{o.__qualname__}" for o in live if isinstance(o, type))
    del live
    loop = asyncio._get_running_loop()
    record: dict[str, Any] = {
        "rss_before_gc": before,
        "rss_after_gc": _statm_rss(),
        "collected": collected,
        "gc_garbage": len(gc.garbage),
        "tasks": len(asyncio.all_tasks(loop)) if loop is not None else None,
        "pymalloc": pymalloc_stats(),
        "malloc": malloc_in_use(),
        "objects": sum(types.values()),
        "types": dict(types.most_common(400)),
        "classes": dict(classes.most_common(20)),
    }
    if tracemalloc.is_tracing():
        tracemalloc.take_snapshot().dump(str(directory / f"{number}.snapshot"))
        record["traced_bytes"] = tracemalloc.get_traced_memory()[0]
    if (directory / "trim").exists():
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        record["rss_after_trim"] = _statm_rss()
    partial = directory / f"{number}.json.part"
    partial.write_text(json.dumps(record))
    partial.rename(directory / f"{number}.json")


def serve_frontend(argv: list[str]) -> int:
    """The frontend exactly as ``python -m tritonforge.openai`` runs it, plus the probe."""
    directory = Path(os.environ[PROBE_DIR_ENV])
    frames = int(os.environ.get(TRACE_ENV, "0"))
    if frames:
        tracemalloc.start(frames)
    signal.signal(signal.SIGUSR1, lambda *_: probe(directory))
    from tritonforge.openai.__main__ import main

    return main(argv)


# --- the load ---------------------------------------------------------------------------

#: Malformed bodies, each refused by the frontend or by the model with a 4xx.
FAULTS: dict[str, dict[str, Any]] = {
    "negative_max_tokens": {"max_tokens": -3},
    "temperature_not_a_number": {"temperature": "hot"},
    "top_p_out_of_range": {"top_p": 1.5},
    "timeout_s_zero": {"timeout_s": 0},
    "unknown_model": {"model": "no_such_model"},
    "bad_json": {},
}
PROMPTS = (
    "Write a sentence about rivers.",
    "List three prime numbers and say why they are prime.",
    "Explain what a checksum is to a child, in two sentences.",
    "Describe a lighthouse at night.",
)


@dataclass(frozen=True)
class Draw:
    route: str  # chat/completions | completions
    stream: bool
    body: bytes
    fault: str | None
    end: str  # read | cancel (task cancelled after cancel_s) | drop (close after events)
    cancel_s: float
    drop_after_events: int


def draw(rng: random.Random, serial: int, cancel_share: float, malformed_share: float) -> Draw:
    """One request, every choice made whatever the earlier ones gave (seeded, repeatable)."""
    chat, stream = rng.random() < 0.5, rng.random() < 0.5
    max_tokens, greedy = rng.choice((16, 32, 64)), rng.random() < 0.5
    cancel, bad = rng.random() < cancel_share, rng.random() < malformed_share
    fault, how, cancel_s = rng.choice(list(FAULTS)), rng.random(), rng.uniform(0.0, 0.4)
    drop_after = rng.randint(1, 6)
    body: dict[str, Any] = {"model": MODEL, "stream": stream, "max_tokens": max_tokens}
    body |= {"timeout_s": 600, "temperature": 0} if greedy else {"temperature": 0.8, "seed": serial}
    prompt = f"{serial}. {PROMPTS[serial % len(PROMPTS)]}"
    body |= {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
    if bad:
        body |= FAULTS[fault]
    raw = json.dumps(body).encode()
    if bad and fault == "bad_json":
        raw = raw[: len(raw) // 2]
    end = "read"
    if cancel and not bad:
        end = "drop" if stream and how < 0.5 else "cancel"
    route = "chat/completions" if chat else "completions"
    return Draw(route, stream, raw, fault if bad else None, end, cancel_s, drop_after)


async def send(session: aiohttp.ClientSession, base: str, d: Draw) -> str:
    """Send ``d``; how it ended: ``HTTP <status>``, ``stream error``, ``dropped`` or a
    client-side error's class."""
    headers = {"content-type": "application/json"}
    try:
        async with session.post(f"{base}/{d.route}", data=d.body, headers=headers) as reply:
            if reply.status != 200 or not d.stream:
                await reply.read()
                return f"HTTP {reply.status}"
            events = 0
            async for line in reply.content:
                if not line.startswith(b"data: "):
                    continue
                events += 1
                if d.end == "drop" and events >= d.drop_after_events:
                    reply.close()  # the client goes away mid-stream
                    return "dropped"
                if line.startswith(b'data: {"error"'):
                    return "stream error"
            return "HTTP 200"
    except aiohttp.ClientError as error:
        return type(error).__name__


@dataclass
class Run:
    """What the load's tasks share."""

    settings: argparse.Namespace
    base_url: str
    frontend: psutil.Process
    started: float = field(default_factory=time.monotonic)
    sent: int = 0
    ended: int = 0
    triton_up: bool = True
    #: Cleared while a probe runs: the workers send nothing new, so every probe sees the
    #: frontend idle, and probes compare like with like.
    go: asyncio.Event = field(default_factory=asyncio.Event)
    outcomes: Counter[str] = field(default_factory=Counter)
    samples: list[dict[str, Any]] = field(default_factory=list)

    def at(self) -> float:
        return round(time.monotonic() - self.started, 1)


async def one(run: Run, session: aiohttp.ClientSession, d: Draw) -> str:
    """``d`` sent, cancelled by the client after ``d.cancel_s`` when it says so."""
    task = asyncio.ensure_future(send(session, run.base_url, d))
    if d.end == "cancel":
        done, _ = await asyncio.wait({task}, timeout=d.cancel_s)
        if not done:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return "cancelled"
    return await task


async def worker(run: Run, session: aiohttp.ClientSession, index: int) -> None:
    """Requests back to back until the run has sent its count; after a 503 a short pause,
    as a client honouring a retry would make (shorter than Retry-After: more 503s)."""
    s = run.settings
    rng = random.Random(s.seed * 1_000_003 + index)
    while run.sent < s.requests:
        await run.go.wait()
        serial, run.sent = run.sent, run.sent + 1
        d = draw(rng, serial, s.cancel_share, s.malformed_share)
        outcome = await one(run, session, d)
        phase = "up" if run.triton_up else "outage"
        run.outcomes[f"{phase} | {d.fault or d.end} | {outcome}"] += 1
        run.ended += 1
        if outcome in ("HTTP 503", "stream error"):
            await asyncio.sleep(0.25)


# --- the run ----------------------------------------------------------------------------


async def sampler(run: Run) -> None:
    """The frontend's RSS every ``sample_s``, with the requests ended by then."""
    while True:
        with contextlib.suppress(psutil.Error):
            rss = run.frontend.memory_info().rss
            run.samples.append({"t": run.at(), "ended": run.ended, "rss": rss})
        await asyncio.sleep(run.settings.sample_s)


async def take_probe(run: Run, directory: Path, label: str) -> dict[str, Any]:
    """Signal the frontend's probe and wait for its record."""
    number = len(list(directory.glob("*.json")))
    run.frontend.send_signal(signal.SIGUSR1)
    target = directory / f"{number}.json"
    for _ in range(1200):
        if target.exists():
            break
        await asyncio.sleep(0.1)
    record: dict[str, Any] = json.loads(target.read_text())
    record |= {"label": label, "number": number, "t": run.at(), "ended": run.ended}
    print(
        f"probe {label}: {run.ended} ended, RSS {record['rss_after_gc'] / MiB:.1f} MiB after "
        f"gc, {record['objects']} objects, {record['tasks']} tasks",
        file=sys.stderr,
    )
    return record


async def restart(run: Run, server: TritonServer, down_s: float, cause: str) -> dict[str, Any]:
    """SIGKILL tritonserver, leave it down ``down_s`` under load, then start a new one on
    the same ports: the frontend must find it."""
    assert server.process is not None
    regions = set().union(*(shm_regions(p.pid) for p in server.group_processes()))
    killed, ended = run.at(), run.ended
    server.process.kill()
    run.triton_up = False
    await asyncio.to_thread(server.stop)
    remove_files(regions)
    await asyncio.sleep(down_s)
    await asyncio.to_thread(server.start)
    await asyncio.to_thread(server.wait_ready)
    run.triton_up = True
    print(f"{cause}: killed at {killed} s, Triton ready again at {run.at()} s", file=sys.stderr)
    return {"cause": cause, "killed_at_s": killed, "ended_at_kill": ended, "ready_at_s": run.at()}


async def outages(run: Run, server: TritonServer, marks: list[int]) -> list[dict[str, Any]]:
    """The planned outages, at each mark (requests ended); and a watchdog: a server that
    ends no request for ``stall_s`` while requests are in flight is killed and restarted
    at once, and the record says so (tritonserver's streaming handler can deadlock)."""
    s, record, pending = run.settings, [], list(marks)
    last, changed = run.ended, time.monotonic()
    while run.ended < s.requests:
        await asyncio.sleep(0.2)
        if pending and run.ended >= pending[0]:
            pending.pop(0)
            record.append(await restart(run, server, s.outage_s, "planned"))
        if run.ended != last or not run.go.is_set() or run.sent == run.ended:
            last, changed = run.ended, time.monotonic()
        elif time.monotonic() - changed > s.stall_s:
            cause = f"stalled: no request ended for {s.stall_s:g} s"
            record.append(await restart(run, server, 0.0, cause))
            last, changed = run.ended, time.monotonic()
    return record


async def checkpoints(run: Run, directory: Path, marks: list[int]) -> list[dict[str, Any]]:
    """A probe of the frontend at each mark (requests ended), taken while Triton is up
    and, ``settle_s`` after the last request ended, idle."""
    taken = []
    for index, mark in enumerate(marks):
        while run.ended < mark or not run.triton_up:
            await asyncio.sleep(0.2)
        run.go.clear()
        while run.sent > run.ended:
            await asyncio.sleep(0.1)
        await asyncio.sleep(run.settings.settle_s)
        taken.append(await take_probe(run, directory, "warm-up" if index == 0 else str(mark)))
        run.go.set()
    return taken


def marks(s: argparse.Namespace) -> tuple[list[int], list[int]]:
    """Requests ended at each probe (the first after the warm-up) and at each outage
    (halfway between two probes)."""
    span = (s.requests - s.warmup) / s.probes
    probes = [int(s.warmup + i * span) for i in range(s.probes)]
    kills = [int(s.warmup + (i + 0.5) * span * s.probes / s.outages) for i in range(s.outages)]
    return probes, kills


async def drive(run: Run, server: TritonServer, directory: Path) -> dict[str, Any]:
    """The whole load with its outages and probes, then two probes idle: as it is, and
    after glibc's ``malloc_trim`` (what of the RSS is freed memory the allocator kept)."""
    s = run.settings
    probe_marks, kill_marks = marks(s)
    connector = aiohttp.TCPConnector(limit=s.concurrency + 8)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    sampling = asyncio.create_task(sampler(run))
    run.go.set()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        probing = asyncio.create_task(checkpoints(run, directory, probe_marks))
        killing = asyncio.create_task(outages(run, server, kill_marks))
        await asyncio.gather(*(worker(run, session, i) for i in range(s.concurrency)))
        taken, kills = await probing, await killing
    await asyncio.sleep(s.settle_s)
    taken.append(await take_probe(run, directory, "end, idle"))
    (directory / "trim").touch()
    taken.append(await take_probe(run, directory, "end, idle, after malloc_trim"))
    sampling.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sampling
    return {"probes": taken, "outages": kills, "wall_s": run.at()}


# --- the figures ------------------------------------------------------------------------


def rss_figures(samples: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """RSS after the warm-up (its first sample past ``warmup`` requests) and at the end of
    the load, its growth, the least-squares slope per 10k requests, and the lowest RSS of
    each fifth of the requests after the warm-up (the sawtooth's troughs)."""
    after = [x for x in samples if x["ended"] >= warmup]
    loaded = [x for x in after if x["ended"] < after[-1]["ended"]] or after
    warm, last = after[0], loaded[-1]
    fit = statistics.linear_regression([x["ended"] for x in loaded], [x["rss"] for x in loaded])
    span = (loaded[-1]["ended"] - warm["ended"]) / 5 or 1
    troughs = []
    for fifth in range(5):
        low, high = warm["ended"] + fifth * span, warm["ended"] + (fifth + 1) * span
        window = [
            x["rss"] for x in loaded if low <= x["ended"] < high or (fifth == 4 and x is last)
        ]
        troughs.append(round(min(window) / MiB, 1) if window else None)
    return {
        "after_warmup_mib": round(warm["rss"] / MiB, 1),
        "end_of_load_mib": round(last["rss"] / MiB, 1),
        "growth_after_warmup_pct": round(100 * (last["rss"] - warm["rss"]) / warm["rss"], 2),
        "min_after_warmup_mib": round(min(x["rss"] for x in loaded) / MiB, 1),
        "max_mib": round(max(x["rss"] for x in samples) / MiB, 1),
        "slope_mib_per_10k_requests": round(fit.slope * 10_000 / MiB, 3),
        "troughs_by_fifth_mib": troughs,
        "requests_in_window": last["ended"] - warm["ended"],
    }


def type_growth(first: dict[str, Any], last: dict[str, Any], top: int = 15) -> list[list[Any]]:
    """Live object types whose count changed most between two probes."""
    names = set(first["types"]) | set(last["types"])
    diff = [(n, last["types"].get(n, 0) - first["types"].get(n, 0)) for n in names]
    diff.sort(key=lambda x: -abs(x[1]))
    return [[n, first["types"].get(n, 0), last["types"].get(n, 0)] for n, _ in diff[:top]]


def allocation_growth(directory: Path, first: int, last: int, top: int = 20) -> list[str]:
    """The allocation sites (file:line) whose live bytes grew most between two probes."""
    older = directory / f"{first}.snapshot"
    newer = directory / f"{last}.snapshot"
    if not (older.exists() and newer.exists()):
        return []
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
    old = tracemalloc.Snapshot.load(str(older)).filter_traces(ignore)
    new = tracemalloc.Snapshot.load(str(newer)).filter_traces(ignore)
    lines = []
    grown = sorted(new.compare_to(old, "lineno"), key=lambda stat: -stat.size_diff)
    for stat in grown[:top]:
        frame = stat.traceback[0]
        where = _short(frame.filename)
        lines.append(
            f"{where}:{frame.lineno}: {stat.size_diff / 1024:+.1f} KiB "
            f"({stat.count_diff:+d} blocks), {stat.size / 1024:.1f} KiB live"
        )
    return lines


def _short(filename: str) -> str:
    """A source file named from ``site-packages/`` or the repository, not this machine."""
    for marker in ("site-packages/", str(REPO) + "/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return Path(filename).name if filename.startswith("/") else filename


PROBE_KEYS = (
    "label", "ended", "rss_before_gc", "rss_after_gc", "objects", "tasks", "gc_garbage",
    "traced_bytes", "rss_after_trim", "pymalloc", "malloc",
)  # fmt: skip


def summarise(result: dict[str, Any], directory: Path) -> None:
    """The figures a reader wants, added to ``result`` in place."""
    s, probes = result["settings"], result["probes"]
    idle = next(p for p in probes if p["label"] == "end, idle")
    result["rss"] = rss_figures(result["rss_samples"], s["warmup"])
    result["probes_table"] = [{k: p.get(k) for k in PROBE_KEYS} for p in probes]
    result["types_growth_warmup_to_end"] = type_growth(probes[0], idle)
    result["allocation_growth_warmup_to_end"] = allocation_growth(
        directory, probes[0]["number"], idle["number"]
    )
    for p in probes:
        del p["types"]


# --- the processes ----------------------------------------------------------------------


def synthetic_repository(parent: Path, overrides: dict[str, Any]) -> Path:
    """``synthetic_model`` alone, its engine settings with ``overrides`` written over them."""
    repository = parent / "model_repository"
    shutil.copytree(MODEL_REPOSITORY / MODEL, repository / MODEL)
    settings_file = repository / MODEL / "1" / "model.json"
    settings = json.loads(settings_file.read_text()) | overrides
    settings_file.write_text(json.dumps(settings, indent=2))
    return repository


def start_frontend(
    s: argparse.Namespace, grpc_url: str, directory: Path, log: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """This script's ``frontend`` mode in a session of its own; its process and base URL."""
    port = free_port()
    env = {**os.environ, PROBE_DIR_ENV: str(directory), TRACE_ENV: str(s.tracemalloc)}
    if s.malloc_arena_max:
        env["MALLOC_ARENA_MAX"] = str(s.malloc_arena_max)
    process = subprocess.Popen(
        [sys.executable, __file__, "frontend", f"--triton-grpc={grpc_url}", f"--port={port}"],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    import requests

    for _ in range(600):
        if process.poll() is not None:
            raise RuntimeError(f"the frontend exited: {log.read_text()[-2000:]}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{base}/health", timeout=2).status_code == 200:
                return process, f"{base}/v1"
        time.sleep(0.2)
    raise TimeoutError("the frontend did not get ready")


#: What the frontend's memory depends on beyond the serving packages the environment names.
FRONTEND_PACKAGES = ("grpcio", "uvicorn", "uvloop", "httptools", "fastapi", "starlette", "pydantic")


def measure(s: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Start tritonserver and the frontend, drive the load, stop both; the record."""
    overrides = json.loads(s.engine_overrides)
    repository = synthetic_repository(work, overrides)
    http, grpc, metrics = free_ports(3)
    server = TritonServer(
        http_port=http, grpc_port=grpc, metrics_port=metrics, models=[MODEL],
        repository=repository, log_path=work / "server.log",
    )  # fmt: skip
    probes = work / "probes"
    probes.mkdir()
    server.start()
    frontend: subprocess.Popen[bytes] | None = None
    try:
        server.wait_ready()
        version = tritonserver_version(server.http_url)
        frontend, base = start_frontend(s, server.grpc_url, probes, work / "frontend.log")
        run = Run(s, base, psutil.Process(frontend.pid))
        result = asyncio.run(drive(run, server, probes))
        result["frontend_exit"] = "running at the end" if frontend.poll() is None else "exited"
    finally:
        if frontend is not None:
            stop_session(frontend, 15.0)
        server.stop()
    log = (work / "frontend.log").read_text(errors="replace")
    result["frontend_log_lines"] = {
        "pending tasks destroyed": log.count("Task was destroyed but it is pending"),
        "errors": log.count("ERROR"),
    }
    result |= {"rss_samples": run.samples, "outcomes": dict(sorted(run.outcomes.items()))}
    result |= {"tritonserver": version, "engine_overrides": overrides, "sent": run.sent}
    result["frontend_versions"] = serving_versions(FRONTEND_PACKAGES)
    result["settings"] = vars(s)
    summarise(result, probes)
    return result


# --- the record -------------------------------------------------------------------------


def _rss_lines(result: dict[str, Any], every: int) -> list[str]:
    rows = ["| s | requests ended | RSS MiB |", "|---|---|---|"]
    samples = result["rss_samples"]
    for x in samples[::every] + ([samples[-1]] if len(samples) % every != 1 else []):
        rows.append(f"| {x['t']} | {x['ended']} | {x['rss'] / MiB:.1f} |")
    return rows


def _probe_lines(result: dict[str, Any]) -> list[str]:
    rows = [
        "| probe | requests ended | RSS before gc (MiB) | after gc | after trim | pymalloc "
        "arenas (MiB) | in live blocks (MiB) | glibc in use (MiB) | glibc free (MiB) | "
        "gc objects | tasks | traced |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in result["probes_table"]:
        cells = [p["label"], p["ended"]]
        for key in ("rss_before_gc", "rss_after_gc", "rss_after_trim"):
            cells.append(f"{p[key] / MiB:.1f}" if p.get(key) else "–")
        arenas = p.get("pymalloc") or {}
        for key in ("arena_bytes", "bytes_in_blocks"):
            cells.append(f"{arenas[key] / MiB:.1f}" if key in arenas else "–")
        glibc = p.get("malloc") or {}
        for key in ("in_use_bytes", "free_in_heaps_bytes"):
            cells.append(f"{glibc[key] / MiB:.1f}" if key in glibc else "–")
        cells += [p["objects"], p["tasks"]]
        cells.append(f"{p['traced_bytes'] / MiB:.2f} MiB" if p.get("traced_bytes") else "–")
        rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    return rows


def report(result: dict[str, Any]) -> str:
    """README.md of a run: the settings, the RSS figures, the probes, what grew."""
    s, r = result["settings"], result["rss"]
    env = Environment.model_validate(result["environment"])
    lines = [
        f"# OpenAI frontend RSS over {result['sent']} requests ({result['started_utc']})",
        "",
        f"`{result['command']}`",
        "",
        f"{MODEL} alone (engine overrides {result['engine_overrides']}), concurrency "
        f"{s['concurrency']}, {s['cancel_share']:.0%} cancelled by the client, "
        f"{s['malformed_share']:.0%} malformed, tritonserver SIGKILLed {s['outages']} times "
        f"under load and restarted after {s['outage_s']:g} s; tracemalloc frames "
        f"{s['tracemalloc'] or 'off'}; MALLOC_ARENA_MAX {s['malloc_arena_max'] or 'unset'}. "
        f"Wall time {result['wall_s']} s.",
        "",
        f"- RSS after the warm-up ({s['warmup']} requests) {r['after_warmup_mib']} MiB, at the "
        f"end of the load {r['end_of_load_mib']} MiB ({r['growth_after_warmup_pct']:+} %, over "
        f"{r['requests_in_window']} requests), min {r['min_after_warmup_mib']}, max "
        f"{r['max_mib']} MiB",
        f"- least-squares slope {r['slope_mib_per_10k_requests']:+} MiB per 10k requests; "
        f"lowest RSS of each fifth of the requests (MiB): {r['troughs_by_fifth_mib']}",
        f"- outages: {result['outages']}",
        f"- lines in the frontend's log: {result['frontend_log_lines']}",
        "",
        *_probe_lines(result),
        "",
        "Live objects (gc-tracked, after a full collection) whose count changed most from "
        "the warm-up probe to the idle end:",
        "",
        "| type | warm-up | end |",
        "|---|---|---|",
        *(f"| {n} | {a} | {b} |" for n, a, b in result["types_growth_warmup_to_end"]),
        "",
    ]
    if result["allocation_growth_warmup_to_end"]:
        lines += ["tracemalloc, the allocation sites that grew most (warm-up → idle end):", ""]
        lines += ["```", *result["allocation_growth_warmup_to_end"], "```", ""]
    lines += ["| outcome (phase | fault or end | answer) | count |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in result["outcomes"].items()] + [""]
    lines += ["RSS samples (every 5th):", "", *_rss_lines(result, 5), ""]
    lines += [
        f"Machine: {describe_machine(env.machine)}.",
        f"Code: {describe_code(env)}. Server: {result['tritonserver']}.",
        "Versions: "
        + ", ".join(f"{k} {v}" for k, v in env.serving_versions.items())
        + "; "
        + ", ".join(f"{k} {v}" for k, v in result.get("frontend_versions", {}).items())
        + ".",
        f"Uncommitted files at launch: {', '.join(result['dirty_files']) or 'none'}.",
        "",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=60_000)
    parser.add_argument("--warmup", type=int, default=5_000)
    parser.add_argument("--concurrency", type=int, default=48)
    parser.add_argument("--cancel-share", type=float, default=0.2)
    parser.add_argument("--malformed-share", type=float, default=0.05)
    parser.add_argument("--outages", type=int, default=3)
    parser.add_argument("--outage-s", type=float, default=20.0)
    parser.add_argument("--probes", type=int, default=5, help="probes from the warm-up on")
    parser.add_argument("--sample-s", type=float, default=2.0)
    parser.add_argument("--stall-s", type=float, default=45.0)
    parser.add_argument("--settle-s", type=float, default=5.0)
    parser.add_argument("--tracemalloc", type=int, default=0, help="frames (0: off)")
    parser.add_argument("--malloc-arena-max", type=int, default=0, help="0: unset")
    parser.add_argument("--engine-overrides", default='{"step_ms": 2, "prefill_ms_per_token": 0}')
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "perf/results/frontend-rss")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    if argv[:1] == ["frontend"]:
        return serve_frontend(argv[1:])
    from tritonforge.launch.model_store import models_dir

    s = parse_args(argv)
    env = capture(models_dir() / "SmolLM2-135M-Instruct")
    dirty = dirty_files()
    stamp_dir = new_run_dir(s.out)
    with tempfile.TemporaryDirectory(prefix="frontend-rss-") as work:
        result = measure(s, Path(work))
    result |= {
        "started_utc": stamp_dir.name,
        "command": " ".join(["python", "perf/frontend_rss.py", *argv]),
        "environment": env.model_dump(),
        "dirty_files": dirty,
    }
    result["settings"]["out"] = str(s.out.relative_to(REPO)) if s.out.is_relative_to(REPO) else ""
    (stamp_dir / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    (stamp_dir / "README.md").write_text(report(result))
    print(stamp_dir / "README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
