"""Unload/reload and shutdown leave nothing running. These run last: they stop things."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading

import psutil
import pytest

from tests.e2e.client import (
    control_model,
    generate,
    llm_inputs,
    model_state,
    stream,
    wait_for,
)
from tritonforge.launch.launcher import TritonServer, free_ports

MODEL = "vllm_model"
pytestmark = [pytest.mark.server, pytest.mark.last]


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory):
    """A server of these tests' own, with vllm_model only.

    They unload, reload and stop it, so they must not depend on what the rest of the
    suite left on the shared server (a model stuck UNLOADING makes Triton's shutdown
    wait out its exit timeout: Triton 2.51 workaround W12, see
    docs/triton-2.51-workarounds.md).
    """
    log = tmp_path_factory.mktemp("lifecycle") / "server.log"
    with TritonServer.on_free_ports(models=[MODEL], log_path=log) as server:
        yield server


def _model_processes(server, model: str) -> list[psutil.Process]:
    """Stub processes serving ``model`` and everything they started (engine core)."""
    found = []
    for proc in server.descendants():
        try:
            if any(f"/{model}/" in part for part in proc.cmdline()):
                found.append(proc)
                found += proc.children(recursive=True)
        except psutil.Error:
            continue
    return found


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in processes:
        with contextlib.suppress(psutil.Error):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
    return alive


def _describe(proc: psutil.Process) -> str:
    """pid, parent, state and command line: what a failed exit check must show."""
    try:
        return (
            f"  pid {proc.pid} (parent {proc.ppid()}, {proc.status()}): {' '.join(proc.cmdline())}"
        )
    except psutil.Error as exc:
        return f"  pid {proc.pid}: {exc!r}"


def test_unload_with_a_request_in_flight_then_reload(own_server) -> None:
    """Triton lets in-flight requests finish before finalize(); then stub and engine exit."""
    server = own_server
    assert server.process is not None, "needs a server owned by the test session"
    before = _model_processes(server, MODEL)
    assert len(before) >= 2  # the stub and vLLM's engine-core process

    outcome: dict = {}
    started = threading.Event()

    def long_request() -> None:
        outcome["result"] = stream(
            server.grpc_url,
            MODEL,
            llm_inputs(
                "Once upon a time",
                sampling={"max_tokens": 120, "ignore_eos": True},
                return_finish_reason=True,
            ),
            on_response=lambda n: n == 2 and started.set(),
            timeout_s=180,
        )

    worker = threading.Thread(target=long_request)
    worker.start()
    assert started.wait(60), "the long request never started streaming"
    control_model(server.grpc_url, "unload", MODEL)
    worker.join(200)
    assert not worker.is_alive(), "the in-flight request hung across the unload"
    result = outcome["result"]
    assert result.error is None, result.error
    assert result.outputs("finish_reason")[-1][0] == b"length"  # it ran to completion
    try:
        wait_for(lambda: not _alive(before), timeout_s=120, what="stub and engine exit")
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}; model state {model_state(server.http_url, MODEL)!r}; still running:\n"
            + "\n".join(_describe(p) for p in _alive(before))
        ) from None
    assert not _model_processes(server, MODEL)

    control_model(server.grpc_url, "load", MODEL)
    answer = generate(
        server.http_url, MODEL, {"text_input": "Hello", "parameters": {"max_tokens": 3}}
    )
    assert "text_output" in answer, answer


def test_shutdown_leaves_no_process(own_server) -> None:
    server = own_server
    assert server.process is not None, "needs a server owned by the test session"
    children = server.descendants()
    assert children, "expected stub processes under the server"
    code = server.stop()
    assert code == 0, f"tritonserver exited with {code}"
    assert not [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not server.group_processes()
    # Every stub exited cleanly, at the unload above and at shutdown (python backend 24.10
    # stubs segfault on exit if a MetricFamily outlives finalize).
    # Guards Triton 2.51 workaround W5, see docs/triton-2.51-workarounds.md.
    log = server.log_path.read_text(errors="replace")
    assert "Segfault" not in log, log[max(0, log.find("Segfault") - 2000) :][:4000]


def test_launcher_stops_the_server_on_sigterm(tmp_path) -> None:
    """`make serve` runs the launcher in the foreground: SIGTERM must stop everything."""
    http, grpc, metrics, openai, launcher_metrics = free_ports(5)
    env = {
        **os.environ,
        "TRITON_HTTP_PORT": str(http),
        "TRITON_GRPC_PORT": str(grpc),
        "TRITON_METRICS_PORT": str(metrics),
        "TRITONFORGE_OPENAI_PORT": str(openai),
        "TRITONFORGE_LAUNCHER_METRICS_PORT": str(launcher_metrics),
    }
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tritonforge.launch.launcher", "--models"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = launcher.stdout.readline()
        assert "tritonforge ready" in line, line
        assert f"OpenAI API http://127.0.0.1:{openai}/v1" in line, line  # beside the server
        server_pids = [p.pid for p in psutil.Process(launcher.pid).children(recursive=True)]
        assert server_pids
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=90) == 0
        assert not [pid for pid in server_pids if psutil.pid_exists(pid)]
    finally:
        if launcher.poll() is None:
            launcher.kill()
