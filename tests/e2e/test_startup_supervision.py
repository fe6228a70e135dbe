"""A tritonserver that dies during ``make serve``'s start-up is restarted, not fatal.

The launcher (``python -m tritonforge.launch.launcher``) is started on free ports with
llama.cpp's model alone (ready in seconds). Its tritonserver is SIGKILLed the moment its
own HTTP readiness answers, while the OpenAI frontend is not up yet — both observed. The
launcher must restart it under its usual rules, print its ready line once everything
serves, answer a chat completion, and stop leaving nothing behind. The other stages are
covered with stand-ins in tests/unit/launch/test_startup_supervision.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest
import requests

from tests.e2e.client import metric, model_state
from tritonforge.bench.reliability.crash_recovery import Launcher
from tritonforge.launch.launcher import answers, session_processes
from tritonforge.launch.stream_probe import STREAMS_STALLED

MODEL = "llamacpp_model"
pytestmark = pytest.mark.server


def _kill_once_ready_before_the_frontend(launcher: Launcher, timeout_s: float) -> int:
    """SIGKILL tritonserver as soon as its HTTP readiness answers; its pid. Fails if the
    frontend was up by then (the stage was missed)."""
    triton_ready = launcher.server.ready_url
    frontend_health = launcher.openai_url.removesuffix("/v1") + "/health"
    deadline = time.monotonic() + timeout_s
    while not answers(triton_ready, timeout_s=1):
        assert launcher.process is not None and launcher.process.poll() is None, (
            launcher.log.read_text(errors="replace")[-3000:]
        )
        assert time.monotonic() < deadline, "tritonserver never became ready"
        time.sleep(0.05)
    triton = launcher.triton()
    frontend_up = answers(frontend_health, statuses=range(100, 600), timeout_s=1)
    triton.kill()
    assert not frontend_up, "the OpenAI frontend was up before tritonserver could be killed"
    return triton.pid


def test_a_tritonserver_killed_before_the_frontend_is_up_is_restarted_and_serves(
    tmp_path: Path,
) -> None:
    launcher = Launcher([MODEL], tmp_path / "launcher.log")
    launcher.start()
    tree: list[psutil.Process] = []
    try:
        killed = _kill_once_ready_before_the_frontend(launcher, timeout_s=300)
        launcher.wait_ready(timeout_s=300)  # the ready line, after the restart
        assert launcher.triton().pid != killed
        assert not session_processes(killed)  # the dead server's group was cleared
        restarts = "tritonforge_tritonserver_restarts_total"
        assert metric(launcher.launcher_metrics_url, restarts, cause="SIGKILL") == 1
        assert metric(launcher.launcher_metrics_url, restarts, cause=STREAMS_STALLED) == 0
        log = launcher.log.read_text(errors="replace")
        assert "tritonserver died (SIGKILL); restart 1" in log, log[-3000:]
        assert model_state(launcher.server.http_url, MODEL) == "READY"
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        reply = requests.post(f"{launcher.openai_url}/chat/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        assert len(reply.json()["choices"]) == 1
        tree = psutil.Process(launcher.process.pid).children(recursive=True)
    finally:
        code = launcher.stop()
    assert code == 0
    psutil.wait_procs(tree, timeout=10)
    assert not [p.pid for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
