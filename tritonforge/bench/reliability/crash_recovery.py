"""How long a tritonserver crash under ``make serve`` takes out serving, against a cold start.

``python -m tritonforge.bench.reliability.crash_recovery`` starts ``make serve``'s
launcher on free ports (by default with ``make serve``'s model set: every model that can
run here), times its cold start per path — Triton HTTP (``/generate``), Triton gRPC (a
streamed request) and the OpenAI API (a chat completion), each "serving" once a real
request is answered — then SIGKILLs tritonserver (what a segfault does, on demand) and
times the same three until they serve again, polling the OpenAI API meanwhile to record
what a client got (503 with Retry-After is the contract). The target: serving again
within the cold start of the same model set + 30 s, the OpenAI frontend the same process.
The run writes ``perf/results/reliability/<UTC time>/recovery.json`` and ``recovery.md``.

:class:`Launcher` is also what tests/e2e/test_crash_recovery.py and
tests/e2e/test_startup_supervision.py run the launcher with.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import aiohttp
import grpc
import psutil

from tritonforge.bench.environment import tritonserver_version
from tritonforge.bench.reliability.clients import GrpcStream, grpc_request, http_generate
from tritonforge.launch.launcher import (
    TritonServer,
    free_ports,
    launcher_metrics_endpoint,
    openai_base_url,
)
from tritonforge.openai.triton_client import CHANNEL_ARGS

#: Allowed on top of the cold start of the same model set (the recovery target).
MARGIN_S = 30.0
PATHS = ("http", "grpc", "openai")


@dataclass
class Launcher:
    """``python -m tritonforge.launch.launcher`` (``make serve``) on free ports of its own."""

    models: list[str] | None
    log: Path
    ports: list[int] = field(default_factory=lambda: free_ports(5))
    #: Where the launcher's stdout goes too (tritonserver's own log shares it).
    stdout_log: Path | None = None
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    _lines: queue.Queue = field(default_factory=queue.Queue)

    @property
    def server(self) -> TritonServer:
        """The tritonserver the launcher runs, on ``ports[:3]``: its addresses as
        :class:`TritonServer` spells them (also what a scenario's ``Server`` needs)."""
        return TritonServer(
            http_port=self.ports[0], grpc_port=self.ports[1], metrics_port=self.ports[2]
        )

    @property
    def openai_url(self) -> str:
        return openai_base_url("127.0.0.1", self.ports[3])

    @property
    def launcher_metrics_url(self) -> str:
        return launcher_metrics_endpoint(self.ports[4])

    def start(self) -> None:
        names = ("TRITON_HTTP", "TRITON_GRPC", "TRITON_METRICS", "TRITONFORGE_OPENAI")
        env = os.environ | {f"{n}_PORT": str(p) for n, p in zip(names, self.ports, strict=False)}
        env["TRITONFORGE_LAUNCHER_METRICS_PORT"] = str(self.ports[4])
        models = [] if self.models is None else ["--models", *self.models]
        self.started_at = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tritonforge.launch.launcher", *models],
            env=env,
            stdout=subprocess.PIPE,
            stderr=self.log.open("ab"),
            stdin=subprocess.DEVNULL,
            text=True,
        )
        threading.Thread(target=self._pump, args=(self.process.stdout,), daemon=True).start()

    def _pump(self, stdout: IO[str]) -> None:
        """The launcher's stdout, line by line, into the queue ``wait_ready`` reads (and
        ``stdout_log``, if set)."""
        copy = self.stdout_log.open("a") if self.stdout_log is not None else None
        try:
            for line in stdout:
                self._lines.put(line)
                if copy is not None:
                    copy.write(line)
                    copy.flush()
        finally:
            if copy is not None:
                copy.close()

    def wait_ready(self, timeout_s: float = 900.0) -> str:
        """The launcher's ready line (the server's own output shares its stdout: skipped);
        the log's tail in the error if it never comes."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                if self.process is not None and self.process.poll() is not None:
                    break  # the launcher exited
                continue
            if line.startswith("tritonforge ready"):
                return line
        tail = self.log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the launcher did not get ready in {timeout_s:.0f} s\n{tail}")

    def _child(self, match: str) -> psutil.Process:
        assert self.process is not None
        [found] = [
            p
            for p in psutil.Process(self.process.pid).children()
            if match in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE
        ]
        return found

    def triton(self) -> psutil.Process:
        """The tritonserver process running now."""
        return self._child("bin/tritonserver")

    def frontend(self) -> psutil.Process:
        return self._child("tritonforge.openai")

    def stop(self, timeout_s: float = 90.0) -> int | None:
        """SIGTERM, as Ctrl-C or a service manager would; SIGKILL if it does not end."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


async def _openai_status(session: aiohttp.ClientSession, url: str, model: str) -> tuple[int, str]:
    body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    try:
        async with session.post(f"{url}/chat/completions", json=body) as reply:
            await reply.read()
            return reply.status, reply.headers.get("Retry-After", "")
    except (aiohttp.ClientError, TimeoutError) as error:
        return 0, type(error).__name__


async def _serves(path: str, launcher: Launcher, model: str, clients: dict) -> bool:
    """One real request on ``path``, answered?"""
    prompt: dict[str, str | bytes | bool] = {"text_input": "Hello", "stream": True}
    sampling = json.dumps({"max_tokens": 2, "temperature": 0})
    if path == "grpc":
        request = grpc_request(model, prompt | {"sampling_parameters": sampling})
        outcome = await GrpcStream(clients["channel"], request).run("probe", timeout_s=60)
        return outcome.ok
    if path == "http":
        body = {"text_input": "Hello", "parameters": {"max_tokens": 2, "temperature": 0}}
        outcome = await http_generate(
            clients["session"], launcher.server, model, body, timeout_s=60
        )
        return outcome.ok
    status, retry_after = await _openai_status(clients["session"], launcher.openai_url, model)
    clients["openai_seen"][f"{status} retry-after={retry_after or '-'}"] += 1
    return status == 200


async def time_to_serve(
    launcher: Launcher, model: str, since: float, timeout_s: float, poll_s: float = 0.5
) -> dict[str, Any]:
    """Seconds from ``since`` until each path answers a real request (None: not within
    ``timeout_s``), and the OpenAI statuses seen before it did."""
    seen: Counter[str] = Counter()
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        channel = grpc.aio.insecure_channel(launcher.server.grpc_url, options=CHANNEL_ARGS)
        clients = {"session": session, "channel": channel, "openai_seen": seen}

        async def until_served(path: str) -> float | None:
            while time.monotonic() - since < timeout_s:
                if await _serves(path, launcher, model, clients):
                    return round(time.monotonic() - since, 2)
                await asyncio.sleep(poll_s)
            return None

        try:
            times = await asyncio.gather(*(until_served(p) for p in PATHS))
        finally:
            await channel.close()
    return {"seconds": dict(zip(PATHS, times, strict=True)), "openai_statuses": dict(seen)}


def _restarts(launcher: Launcher) -> dict[str, float]:
    """The launcher's restart counter by cause."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(launcher.launcher_metrics_url, timeout=10).text
    return {
        sample.labels["cause"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "tritonforge_tritonserver_restarts"
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def measure(launcher: Launcher, model: str, settle_s: float, timeout_s: float) -> dict[str, Any]:
    """Cold start, then a SIGKILL of tritonserver and the recovery, on ``launcher``."""
    launcher.start()
    ready_line_s = None
    try:
        launcher.wait_ready(timeout_s)
        ready_line_s = round(time.monotonic() - launcher.started_at, 2)
        version = tritonserver_version(launcher.server.http_url)
        cold = asyncio.run(time_to_serve(launcher, model, launcher.started_at, timeout_s))
        time.sleep(settle_s)  # the launcher's model poll has run; the engines are idle
        frontend, dead = launcher.frontend(), launcher.triton()
        group = [dead, *dead.children(recursive=True)]
        killed = time.monotonic()
        dead.kill()
        recovery = asyncio.run(time_to_serve(launcher, model, killed, timeout_s, poll_s=0.25))
        same_frontend = launcher.frontend().pid == frontend.pid
        restarts = _restarts(launcher)
    finally:
        code = launcher.stop()
    left = [p.pid for p in group if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    return {
        "tritonserver": version,
        "ready_line_s": ready_line_s,
        "cold_start": cold,
        "recovery": recovery,
        "frontend_same_process": same_frontend,
        "restarts_by_cause": restarts,
        "dead_group_processes_left": left,
        "launcher_exit_code": code,
    }


def verdict(figures: dict[str, Any], margin_s: float = MARGIN_S) -> list[str]:
    """What missed the target: a path not back within its cold start + ``margin_s``."""
    failures = []
    for path in PATHS:
        cold = figures["cold_start"]["seconds"][path]
        back = figures["recovery"]["seconds"][path]
        if cold is None or back is None or back > cold + margin_s:
            failures.append(f"{path}: serving again after {back} s, cold start {cold} s")
    if not figures["frontend_same_process"]:
        failures.append("the OpenAI frontend process changed")
    if figures["dead_group_processes_left"]:
        failures.append(f"left running: {figures['dead_group_processes_left']}")
    return failures


def report(result: dict[str, Any]) -> str:
    """recovery.md: the verdict, the three paths side by side, and what clients got."""
    from tritonforge.bench.environment import Environment, describe_code, describe_machine

    env = Environment.model_validate(result["environment"])
    figures = result["figures"]
    rows = [
        f"| {path} | {figures['cold_start']['seconds'][path]} | "
        f"{figures['recovery']['seconds'][path]} |"
        for path in PATHS
    ]
    statuses = ", ".join(f"{k}: {v}" for k, v in figures["recovery"]["openai_statuses"].items())
    failures = result["failures"]
    verdict_line = "pass" if not failures else "**fail**: " + "; ".join(failures)
    return "\n".join(
        [
            f"# tritonserver SIGKILLed under the launcher ({result['started_utc']})",
            "",
            f"`{result['command']}`",
            "",
            f"Models: {', '.join(result['models'])}. Probe model: `{result['probe_model']}`.",
            f"Target: each path serving again within its cold start + {MARGIN_S:.0f} s → "
            f"{verdict_line}.",
            "",
            "| path | cold start (s, from launcher start) | serving again (s, from SIGKILL) |",
            "|---|---|---|",
            *rows,
            "",
            f"- launcher's ready line after {figures['ready_line_s']} s",
            f"- OpenAI answers while Triton was down or loading (polled every 0.25 s): {statuses}",
            f"- OpenAI frontend the same process throughout: {figures['frontend_same_process']}",
            f"- launcher's restart counter: {figures['restarts_by_cause']}",
            "- processes of the killed server's group left: "
            f"{figures['dead_group_processes_left']}",
            f"- load average at start {result['load_average_at_start']}, at end "
            f"{result['load_average_at_end']}; other tritonservers at start: "
            f"{len(result['other_tritonservers_at_start'])}",
            "",
            f"Machine: {describe_machine(env.machine)}.",
            f"Code: {describe_code(env)}. Server: {env.tritonserver}.",
            "Versions: " + ", ".join(f"{k} {v}" for k, v in env.serving_versions.items()) + ".",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    from tritonforge.bench.environment import capture, served_code
    from tritonforge.bench.soak import RESULTS_ROOT, other_tritonservers
    from tritonforge.launch.launcher import available_models
    from tritonforge.launch.model_store import ensure_default_model

    parser = argparse.ArgumentParser(prog="python -m tritonforge.bench.reliability.crash_recovery")
    parser.add_argument("--models", nargs="*", help="default: make serve's (all that can run)")
    parser.add_argument("--probe-model", default="vllm_model")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds between ready and kill")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--results", type=Path, default=RESULTS_ROOT)
    args = parser.parse_args(argv)
    code = served_code()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.results / stamp
    out.mkdir(parents=True, exist_ok=True)
    env = capture(ensure_default_model(quiet=True), code)
    load_start, others = os.getloadavg(), other_tritonservers()
    launcher = Launcher(args.models, out / "launcher.log")
    figures = measure(launcher, args.probe_model, args.settle, args.timeout)
    env.tritonserver = figures.pop("tritonserver")
    result = {
        "started_utc": stamp,
        "command": "python -m tritonforge.bench.reliability.crash_recovery "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "models": args.models if args.models is not None else available_models(),
        "probe_model": args.probe_model,
        "figures": figures,
        "failures": verdict(figures),
        "environment": env.model_dump(),
        "load_average_at_start": load_start,
        "load_average_at_end": os.getloadavg(),
        "other_tritonservers_at_start": others,
    }
    (out / "recovery.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "recovery.md").write_text(report(result))
    print(out / "recovery.md")
    return 0 if not result["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
