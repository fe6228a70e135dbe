"""A crash of tritonserver under ``make serve``'s launcher is an incident of seconds.

The launcher (``python -m tritonforge.launch.launcher``, what ``make serve`` runs) is
started on free ports of its own with llama.cpp's model alone (ready in seconds; the
supervision does not depend on the models) — never the session's server, which other
tests use. A model loaded over gRPC after the start stands for "loaded at run time".
Then tritonserver is SIGKILLed (a segfault's effect, on demand) with a gRPC stream and
an OpenAI stream in flight:

- both streams end with an error, none hangs;
- the OpenAI frontend answers 503 with Retry-After while Triton is down, and serves
  again once it is back — the same frontend process;
- the launcher restarts tritonserver with both models, counts the restart by cause, and
  removes what the dead server left (processes, shared memory);
- a model's stub that crashes (SIGSEGV) is a crash too: its request ends with an error
  and the launcher restarts the server;
- SIGTERM to the launcher still stops everything.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import requests

from tests.e2e.client import Hold, control_model, metric, model_state, wait_for
from tritonforge.bench.reliability.crash_recovery import Launcher
from tritonforge.launch.launcher import session_processes
from tritonforge.launch.supervisor import shm_regions

MODEL = "llamacpp_model"
RUNTIME_MODEL = "preprocessing"  # C++ tokenizer model: loads in well under a second
pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    log = tmp_path_factory.mktemp("crash") / "launcher.log"
    launcher = Launcher([MODEL], log)
    launcher.start()
    try:
        launcher.wait_ready(timeout_s=300)
        yield launcher
    finally:
        launcher.stop()


def _chat(
    base: str, stream_it: bool, max_tokens: int, timeout_s: float = 60, **extra: object
) -> requests.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": max_tokens,
        "stream": stream_it,
        **extra,
    }
    return requests.post(f"{base}/chat/completions", json=body, stream=stream_it, timeout=timeout_s)


def _openai_stream(base: str, started: threading.Event, events: list[str]) -> None:
    with _chat(base, True, 1000, ignore_eos=True) as reply:  # still generating at the kill
        assert reply.status_code == 200
        for line in reply.iter_lines(decode_unicode=True):
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
                started.set()


def _in_flight(launched: Launcher) -> tuple[threading.Thread, Hold, list[str]]:
    """An OpenAI stream and a gRPC stream, both generating: in flight at the kill."""
    openai_events: list[str] = []
    openai_started = threading.Event()
    openai = threading.Thread(
        target=_openai_stream, args=(launched.openai_url, openai_started, openai_events)
    )
    openai.start()
    assert openai_started.wait(60), "the OpenAI stream never started"
    grpc = Hold(launched.server.grpc_url, MODEL, "Once upon a time")
    grpc.wait_responses()
    return openai, grpc, openai_events


def test_a_killed_tritonserver_is_back_and_the_frontend_served_503_meanwhile(launched) -> None:
    control_model(launched.server.grpc_url, "load", RUNTIME_MODEL)
    frontend = launched.frontend()
    dead = launched.triton()
    wait_for(
        lambda: (
            metric(
                launched.launcher_metrics_url, "tritonforge_restored_models", model=RUNTIME_MODEL
            )
            == 1
        ),
        what="the launcher to follow the model loaded at run time",
    )
    regions = shm_regions(dead.pid)
    assert regions, "expected the python backend's shared memory mapped by the server"
    openai, grpc, openai_events = _in_flight(launched)

    dead.kill()
    killed = time.monotonic()
    down = _chat(launched.openai_url, False, 4, timeout_s=10)
    openai.join(30)
    grpc.wait_end(30)
    grpc.cancel()
    assert not openai.is_alive(), "a stream in flight hung after the crash"
    assert grpc.error is not None  # ended with an error, not a FINAL
    assert openai_events[-1] == "[DONE]"
    assert "error" in json.loads(openai_events[-2]), openai_events[-2]
    assert down.status_code == 503, down.text
    assert int(down.headers["retry-after"]) > 0
    assert down.json()["error"]["code"] == "service_unavailable"

    wait_for(lambda: _serves(launched), timeout_s=180, what="the OpenAI API to serve again")
    recovery_s = time.monotonic() - killed
    assert launched.frontend().pid == frontend.pid  # the frontend never restarted
    assert launched.triton().pid != dead.pid
    assert model_state(launched.server.http_url, MODEL) == "READY"
    assert model_state(launched.server.http_url, RUNTIME_MODEL) == "READY"  # loaded at run time
    restarts = metric(
        launched.launcher_metrics_url, "tritonforge_tritonserver_restarts_total", cause="SIGKILL"
    )
    assert restarts == 1
    log = launched.log.read_text(errors="replace")
    assert "tritonserver died (SIGKILL); restart 1" in log, log[-3000:]
    assert not session_processes(dead.pid)  # its stubs and reapers are gone
    assert not [r for r in regions if Path(r).exists()]  # and its shared memory
    print(f"serving again {recovery_s:.1f} s after the kill")


def _serves(launched: Launcher) -> bool:
    reply = _chat(launched.openai_url, False, 4)
    return reply.status_code == 200 and len(reply.json()["choices"]) == 1


def _stub_of(launched: Launcher, model: str) -> psutil.Process:
    [stub] = [
        p
        for p in launched.triton().children()
        if p.name().startswith("triton_python") and f"/{model}/" in " ".join(p.cmdline())
    ]
    return stub


def test_a_crashed_model_stub_is_a_crash_not_a_hang(launched) -> None:
    """Triton 2.51 never notices a python backend stub that died (it stays a zombie) and
    its model's requests would wait forever: the launcher ends and restarts the server."""
    wait_for(lambda: _serves(launched), timeout_s=180, what="the server to serve")
    server = launched.triton()
    with Hold(launched.server.grpc_url, MODEL, "Once upon a time") as generating:
        generating.wait_responses()
        _stub_of(launched, MODEL).send_signal(signal.SIGSEGV)
        generating.wait_end(60)  # a request to the dead stub's model does not hang
        assert generating.error is not None
    wait_for(lambda: _serves(launched), timeout_s=180, what="the server to serve again")
    assert launched.triton().pid != server.pid
    restarts = metric(
        launched.launcher_metrics_url,
        "tritonforge_tritonserver_restarts_total",
        cause="model stub died",
    )
    assert restarts == 1
    assert "tritonserver died (model stub died)" in launched.log.read_text(errors="replace")


def test_sigterm_to_the_launcher_still_stops_everything(launched) -> None:
    tree = psutil.Process(launched.process.pid).children(recursive=True)
    assert tree
    regions = shm_regions(launched.triton().pid)
    launched.process.send_signal(signal.SIGTERM)
    assert launched.process.wait(timeout=90) == 0
    psutil.wait_procs(tree, timeout=10)
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert regions and not [r for r in regions if Path(r).exists()]  # nor shared memory
    died = launched.log.read_text(errors="replace").count("tritonserver died")
    assert died == 2  # the kill and the dead stub
