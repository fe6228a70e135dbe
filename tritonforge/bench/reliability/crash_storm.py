"""Crash storm: requests cancelled at chosen moments, counting crashes (server or stub).

Triton 2.51 died once here (SIGSEGV) right after a client cancelled a gRPC stream, and
upstream fixed cancellation races after that release (docs/features/reliability.md). This
storm looks for the trigger: clients cancel requests at one of several moments, each a
*pattern*, and every crash of the server is recorded with the cancels of each pattern
issued in the second before it, the server's log lines before it, and its exit cause;
the server is then started again and the storm goes on, until ``cancels`` cancels or
``max_crashes`` crashes. The figure is crashes per 1,000 cancels, per pattern. A request
that has not ended within ``HUNG_AFTER_S`` (no FINAL, no error, the call still open) is
counted as hung, by pattern and model, with the id it was sent with.

Patterns (gRPC streams unless said otherwise):

- ``before_first``: cancelled 0-5 ms after the request was sent, before any response;
- ``mid_stream``: cancelled after 1-8 responses of a 64-token request;
- ``around_final``: a request of 2-6 tokens, cancelled from just before its last token
  to just after its FINAL response — the race of server#7368 (a cancellation meeting a
  request's completion);
- ``after_final``: cancelled the moment its FINAL response arrived, the call still open;
- ``sse_disconnect``: HTTP ``generate_stream`` whose connection is dropped after 1-8
  events;
- ``openai_disconnect``: a streamed chat completion through the OpenAI frontend (started
  beside the server for this pattern), dropped after 1-8 events.

``python -m tritonforge.bench.reliability.crash_storm --models vllm_model --cancels 5000``
writes ``perf/results/crash-storm/<UTC time>/results.json`` and ``report.md``.

``--guarded-inner synthetic_model`` serves a copy of the repository whose ``guarded_chat``
calls the synthetic engine instead of vLLM: hundreds of BLS calls a second instead of a
few, the stub's threads at their busiest — the amplifier for a race inside
``guarded_chat``'s stub. ``--repository`` serves another model repository (for example
one holding an older ``guarded_chat``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import shutil
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import psutil

from tritonforge.bench.reliability.clients import GrpcStream, grpc_request
from tritonforge.bench.reliability.models import models_to_load
from tritonforge.launch.launcher import OpenAIFrontend, TritonServer
from tritonforge.launch.supervisor import STUB_DIED, dead_children, exit_cause
from tritonforge.openai.triton_client import CHANNEL_ARGS
from tritonforge.paths import MODEL_REPOSITORY, REPO_ROOT, new_run_dir

HTTP_PATTERNS = ("sse_disconnect", "openai_disconnect")
PATTERNS = ("before_first", "mid_stream", "around_final", "after_final", *HTTP_PATTERNS)
RESULTS_ROOT = REPO_ROOT / "perf" / "results" / "crash-storm"
#: A crash is attributed to the cancels issued in this window before it.
BLAME_WINDOW_S = 1.0
#: A request still open this long after it was sent has hung.
HUNG_AFTER_S = 120.0


class Hung(Exception):
    """The request did not end within ``HUNG_AFTER_S``."""


def _is_final(message: Any) -> bool:
    final = message.infer_response.parameters.get("triton_final_response")
    return final is not None and final.bool_param


def _request(model: str, max_tokens: int, rng: random.Random) -> Any:
    sampling = {"max_tokens": max_tokens, "temperature": 0.8, "seed": rng.randrange(1 << 30)}
    inputs: dict[str, str | bytes | bool] = {
        "text_input": f"Tell story number {rng.randrange(1000)}.",
        "sampling_parameters": json.dumps(sampling),
        "stream": True,
    }
    return grpc_request(model, inputs)


async def _grpc_cancel(
    pattern: str, channel: Any, model: str, rng: random.Random, request_id: str = ""
) -> bool:
    """One gRPC stream cancelled at ``pattern``'s moment; False if it ended first.

    Raises :class:`Hung` when the request had not ended after ``HUNG_AFTER_S``.
    """
    tokens = {"mid_stream": 64, "around_final": rng.randint(2, 6)}.get(pattern, 32)
    request = _request(model, tokens, rng)
    request.id = request_id
    stream = GrpcStream(channel, request)
    if pattern == "before_first":
        await asyncio.sleep(rng.uniform(0, 0.005))
        stream.call.cancel()
        return True
    stop_after = {"mid_stream": rng.randint(1, 8), "around_final": tokens - 1}.get(pattern)
    seen = 0
    try:
        async with asyncio.timeout(HUNG_AFTER_S):
            async for message in stream.call:
                if message.error_message:
                    return False
                seen += bool(message.infer_response.outputs)
                if _is_final(message):
                    if pattern in ("after_final", "around_final"):
                        stream.call.cancel()
                        return True
                    return False
                if stop_after is not None and seen >= stop_after:
                    if pattern == "around_final":  # land anywhere near the last token
                        await asyncio.sleep(rng.uniform(0, 0.06))
                    stream.call.cancel()
                    return True
    except grpc.aio.AioRpcError:
        stream.call.cancel()
    except TimeoutError:
        stream.call.cancel()
        raise Hung from None
    return False


async def _sse_disconnect(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], rng: random.Random
) -> bool:
    """POST a streamed request to ``url`` and drop the connection after 1-8 events.

    Raises :class:`Hung` when the stream had neither ended nor been dropped after
    ``HUNG_AFTER_S``.
    """
    events, stop_after = 0, rng.randint(1, 8)
    try:
        async with asyncio.timeout(HUNG_AFTER_S), session.post(url, json=body) as reply:
            async for line in reply.content:
                events += line.startswith(b"data: ")
                if events >= stop_after:
                    reply.close()  # the connection is dropped mid-stream
                    return True
    except aiohttp.ClientError:
        pass
    except TimeoutError:
        raise Hung from None
    return False


def _sse_target(pattern: str, storm: Storm, model: str) -> tuple[str, dict[str, Any]]:
    """Where an HTTP pattern sends its request, and the body: Triton's or OpenAI's."""
    if pattern == "openai_disconnect":
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "Tell a story."}],
            "max_tokens": 64,
            "temperature": 0.8,
            "stream": True,
        }
        return f"{storm.openai_url}/chat/completions", body
    body = {
        "text_input": "Tell a story.",
        "stream": True,  # one event per step (without it: one event for the whole answer)
        "parameters": {"max_tokens": 64, "temperature": 0.8},
    }
    return f"http://{storm.server.http_url}/v2/models/{model}/generate_stream", body


@dataclass
class HungRequest:
    pattern: str
    model: str
    request_id: str
    seconds_into_storm: float


@dataclass
class Crash:
    at_cancels: int
    cause: str
    seconds_into_storm: float
    cancels_in_window: dict[str, int]
    log_tail: list[str]


@dataclass
class Storm:
    """The storm's shared state: the server, its counts, and whether it is serving now."""

    server: TritonServer
    models: list[str]
    rng: random.Random
    openai_url: str | None = None  # the OpenAI frontend's /v1, for openai_disconnect
    cancels: Counter[str] = field(default_factory=Counter)
    recent: deque[tuple[float, str]] = field(default_factory=lambda: deque(maxlen=4096))
    crashes: list[Crash] = field(default_factory=list)
    hung: list[HungRequest] = field(default_factory=list)
    sent: int = 0  # requests sent, cancelled or not
    serving: asyncio.Event = field(default_factory=asyncio.Event)
    started: float = field(default_factory=time.monotonic)

    def record(self, pattern: str) -> None:
        self.cancels[pattern] += 1
        self.recent.append((time.monotonic(), pattern))

    def in_window(self, now: float) -> dict[str, int]:
        return dict(Counter(p for t, p in self.recent if now - t <= BLAME_WINDOW_S))


def log_tail(path: Path | None, lines: int = 60) -> list[str]:
    """The server log's last lines (what it said before it died)."""
    if path is None or not path.exists():
        return []
    with path.open("rb") as handle:
        handle.seek(max(0, path.stat().st_size - 64 * 1024))
        text = handle.read().decode("utf-8", errors="replace")
    return text.splitlines()[-lines:]


async def _one(storm: Storm, pattern: str, channel: Any, session: aiohttp.ClientSession) -> bool:
    model = storm.rng.choice(storm.models)
    storm.sent += 1
    request_id = f"storm-{storm.sent}"
    try:
        if pattern in HTTP_PATTERNS:
            url, body = _sse_target(pattern, storm, model)
            done = await _sse_disconnect(session, url, body, storm.rng)
        else:
            done = await _grpc_cancel(pattern, channel, model, storm.rng, request_id)
    except Hung:
        if storm.serving.is_set():  # a crash's requests are the crash's, not hangs
            elapsed = round(time.monotonic() - storm.started, 1)
            storm.hung.append(HungRequest(pattern, model, request_id, elapsed))
            print(f"crash storm: {pattern} request {request_id} to {model} hung", file=sys.stderr)
        return False
    if done and storm.serving.is_set():
        storm.record(pattern)
    return done


async def _client(storm: Storm, patterns: list[str], until: dict[str, float]) -> None:
    """One client: a pattern drawn at random per request, until a limit of ``until``."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=180)) as session:
        channel = grpc.aio.insecure_channel(storm.server.grpc_url, options=CHANNEL_ARGS)
        try:
            while (
                sum(storm.cancels.values()) < until["cancels"]
                and len(storm.crashes) < until["crashes"]
                and time.monotonic() < until["deadline"]
            ):
                await storm.serving.wait()
                if not await _one(storm, storm.rng.choice(patterns), channel, session):
                    await asyncio.sleep(0.05)  # not a cancel (ended first, or refused)
        finally:
            await channel.close()


async def _watch(storm: Storm, stop: asyncio.Event) -> None:
    """Notice a crash — the server's exit, or a model's stub dead over two polls (2.51
    never reaps it and its requests would hang: the server is killed, as the launcher
    does) — record it, start the server again, let the clients go on."""
    seen_dead: set[int] = set()
    stubs: dict[int, str] = {}  # a stub's model, read while it lives (a zombie has no cmdline)
    while not stop.is_set():
        process, cause = storm.server.process, None
        if process is not None:
            code = process.poll()
            if code is not None:
                cause = exit_cause(code)
            else:
                stub_models(process.pid, stubs)
                dead = dead_children(process.pid)
                if still := dead & seen_dead:
                    which = ", ".join(f"{pid} {stubs.get(pid, '?')}" for pid in sorted(still))
                    cause = f"{STUB_DIED} (pid {which})"
                    process.kill()
                seen_dead = dead
        if cause is not None:
            await _record_and_restart(storm, cause)
            seen_dead = set()
            stubs = {}
        await asyncio.sleep(0.1)


def stub_models(server_pid: int, known: dict[int, str]) -> None:
    """Add the model each new python-backend stub of the server serves (from its
    command line: the model's ``model.py`` path) to ``known``."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(server_pid).children():
            if child.pid in known:
                continue
            with contextlib.suppress(psutil.Error):
                paths = [Path(a) for a in child.cmdline()[1:2] if a.endswith(".py")]
                known[child.pid] = paths[0].parent.parent.name if paths else child.name()


async def _record_and_restart(storm: Storm, cause: str) -> None:
    storm.serving.clear()
    now = time.monotonic()
    crash = Crash(
        at_cancels=sum(storm.cancels.values()),
        cause=cause,
        seconds_into_storm=round(now - storm.started, 1),
        cancels_in_window=storm.in_window(now),
        log_tail=log_tail(storm.server.log_path),
    )
    storm.crashes.append(crash)
    print(f"crash storm: {cause}", file=sys.stderr, flush=True)
    await asyncio.to_thread(storm.server.stop)
    await asyncio.to_thread(storm.server.start)
    await asyncio.to_thread(storm.server.wait_ready)
    storm.serving.set()


async def run_storm(
    server: TritonServer,
    models: list[str],
    patterns: list[str],
    concurrency: int,
    seed: int,
    until: dict[str, float],
    openai_url: str | None = None,
) -> Storm:
    """Storm a ready ``server`` until ``until``'s cancels, crashes or minutes are reached."""
    storm = Storm(server, models, random.Random(seed), openai_url)
    storm.serving.set()
    stop = asyncio.Event()
    watcher = asyncio.create_task(_watch(storm, stop))
    limits = dict(until) | {"deadline": time.monotonic() + 60 * until["minutes"]}
    try:
        await asyncio.gather(*(_client(storm, patterns, limits) for _ in range(concurrency)))
    finally:
        stop.set()
        await watcher
    return storm


def rates(storm: Storm) -> dict[str, Any]:
    """Crashes per 1,000 cancels, overall and per pattern (blamed: in the window before)."""
    total = sum(storm.cancels.values())
    blamed: Counter[str] = Counter()
    for crash in storm.crashes:
        blamed.update(crash.cancels_in_window.keys())
    per_pattern = {
        p: {
            "cancels": n,
            "crashes_with_it_in_window": blamed[p],
            "per_1000": round(1000 * blamed[p] / n, 3) if n else None,
        }
        for p, n in sorted(storm.cancels.items())
    }
    overall = round(1000 * len(storm.crashes) / total, 3) if total else None
    hung = Counter(f"{h.pattern} {h.model}" for h in storm.hung)
    return {
        "cancels": total,
        "requests_sent": storm.sent,
        "crashes": len(storm.crashes),
        "per_1000": overall,
        "hung": len(storm.hung),
        "hung_by_pattern_and_model": dict(sorted(hung.items())),
    } | {"by_pattern": per_pattern}


def report(result: dict[str, Any]) -> str:
    """report.md: the rate per pattern, then each crash with its window and log tail."""
    figures = result["rates"]
    lines = [
        f"# Crash storm on tritonserver ({result['started_utc']})",
        "",
        f"`{result['command']}`",
        "",
        f"Models: {', '.join(result['models'])}; concurrency {result['concurrency']}; "
        f"server: {result['tritonserver']}.",
        f"**{figures['crashes']} crash(es) in {figures['cancels']} cancels** "
        f"({figures['per_1000']} per 1,000); "
        f"**{figures.get('hung', 0)} request(s) hung** (no end within {HUNG_AFTER_S:g} s) "
        f"of {figures.get('requests_sent', '?')} sent.",
        "",
        "| pattern | cancels | crashes with it in the last second | per 1,000 |",
        "|---|---|---|---|",
    ]
    for pattern, row in figures["by_pattern"].items():
        lines.append(
            f"| {pattern} | {row['cancels']} | {row['crashes_with_it_in_window']} | "
            f"{row['per_1000']} |"
        )
    if result.get("hung"):
        lines += ["", "## Hung requests", ""]
        lines += [
            f"- {h['pattern']} to {h['model']}, id {h['request_id']}, sent "
            f"{h['seconds_into_storm'] - HUNG_AFTER_S:.0f} s into the storm"
            for h in result["hung"]
        ]
    for i, crash in enumerate(result["crashes"], 1):
        lines += [
            "",
            f"## Crash {i}: {crash['cause']} after {crash['at_cancels']} cancels "
            f"({crash['seconds_into_storm']} s)",
            f"Cancels in the second before: {crash['cancels_in_window']}",
            "",
            "```",
            *crash["log_tail"][-30:],
            "```",
        ]
    return "\n".join(lines) + "\n"


def storm_models(models: list[str], repository: Path = MODEL_REPOSITORY) -> list[str]:
    """What the server must load for ``models``: an ensemble's steps, and the models
    guarded_chat calls (its BLS calls the guard and the model its ``llm_model`` names)."""
    from tritonforge.repo import pbtxt

    needed = list(models)
    if "guarded_chat" in models:
        config = pbtxt.read(repository / "guarded_chat" / "config.pbtxt")
        needed += ["guard", config.parameters["llm_model"].string_value]
    return models_to_load(needed, repository)


def guarded_over(inner: str, source: Path, out: Path) -> Path:
    """A repository like ``source`` whose ``guarded_chat`` (copied) calls ``inner``;
    the other models are links to ``source``'s."""
    repository = out / "repository"
    repository.mkdir()
    for model in sorted(source.iterdir()):
        if model.name != "guarded_chat" and (model / "config.pbtxt").exists():
            (repository / model.name).symlink_to(model.resolve())
    guarded = repository / "guarded_chat"
    shutil.copytree(
        (source / "guarded_chat").resolve(), guarded, ignore=shutil.ignore_patterns("__pycache__")
    )
    config = guarded / "config.pbtxt"
    text, count = re.subn(
        r'(key: "llm_model" value: \{ string_value: )"[^"]*"',
        lambda m: f'{m.group(1)}"{inner}"',
        config.read_text(),
    )
    if count != 1:
        raise ValueError(f"{config}: no llm_model parameter to point at {inner}")
    config.write_text(text)
    return repository


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tritonforge.bench.reliability.crash_storm")
    parser.add_argument("--models", nargs="+", default=["vllm_model"])
    parser.add_argument("--patterns", nargs="+", default=list(PATTERNS), choices=PATTERNS)
    parser.add_argument("--cancels", type=int, default=5000, help="stop after this many")
    parser.add_argument("--max-crashes", type=int, default=5, help="or after this many crashes")
    parser.add_argument("--minutes", type=float, default=60.0, help="or after this long")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose-log", action="store_true", help="tritonserver --log-verbose=1")
    parser.add_argument("--repository", type=Path, default=MODEL_REPOSITORY)
    parser.add_argument(
        "--guarded-inner", metavar="MODEL", help="serve guarded_chat over MODEL (a copy)"
    )
    parser.add_argument("--results", type=Path, default=RESULTS_ROOT)
    return parser


def main(argv: list[str] | None = None) -> int:
    from tritonforge.bench.environment import capture, served_code, tritonserver_version
    from tritonforge.launch.model_store import ensure_default_model

    args = _parser().parse_args(argv)
    code = served_code()
    out = new_run_dir(args.results)
    stamp = out.name
    env = capture(ensure_default_model(quiet=True), code)
    extra = ["--log-verbose=1"] if args.verbose_log else []
    repository = args.repository
    if args.guarded_inner:
        repository = guarded_over(args.guarded_inner, repository, out)
    server = TritonServer.on_free_ports(
        models=storm_models(args.models, repository),
        repository=repository,
        log_path=out / "server.log",
        extra_args=extra,
    )
    frontend = None
    if "openai_disconnect" in args.patterns:
        frontend = OpenAIFrontend.on_free_port(server.grpc_url, log_path=out / "openai.log")
    server.start()
    try:
        server.wait_ready()
        env.tritonserver = tritonserver_version(server.http_url)
        if frontend is not None:
            frontend.start()
            frontend.wait_ready()
        until = {"cancels": args.cancels, "crashes": args.max_crashes, "minutes": args.minutes}
        storm = asyncio.run(
            run_storm(
                server,
                args.models,
                args.patterns,
                args.concurrency,
                args.seed,
                until,
                frontend.base_url if frontend else None,
            )
        )
    finally:
        if frontend is not None:
            frontend.stop()
        server.stop()
    result = {
        "started_utc": stamp,
        "command": "python -m tritonforge.bench.reliability.crash_storm "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "models": args.models,
        "concurrency": args.concurrency,
        "tritonserver": env.tritonserver,
        "rates": rates(storm),
        "crashes": [vars(c) for c in storm.crashes],
        "hung": [vars(h) for h in storm.hung],
        "seconds": round(time.monotonic() - storm.started, 1),
        "environment": env.model_dump(),
    }
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "report.md").write_text(report(result))
    print(out / "report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
