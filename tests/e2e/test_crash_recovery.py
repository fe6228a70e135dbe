"""A crash of tritonserver under ``make serve``'s launcher is an incident of seconds.

The launcher (``python -m tritonforge.launch.launcher``, what ``make serve`` runs) is
started on free ports of its own with llama.cpp's model alone (ready in seconds; the
supervision does not depend on the models) — never the session's server, which other
tests use. A model loaded over gRPC after the start stands for "loaded at run time".
Then tritonserver is SIGKILLed (a segfault's effect, on demand) with llama.cpp's slots
full — a gRPC stream and an OpenAI stream generating, holds in the other slots — and a
non-streamed and a streamed OpenAI request queued behind them:

- the streams that had sent tokens end with an error, none hangs: the gRPC one as
  Triton's ports die with the server, the OpenAI one with the restart's error event
  naming the tokens it had sent, never replayed;
- the two queued OpenAI requests, which had sent nothing, are answered once the server
  is back — same request id, the stream from its first token — and so is one sent
  while Triton was down (the frontend's health said so): the same frontend process;
- the launcher restarts tritonserver with both models, counts the restart by cause, and
  removes what the dead server left (processes, shared memory);
- a model's stub that crashes (SIGSEGV) is a crash too: its request ends with an error
  and the launcher restarts the server;
- SIGTERM to the launcher drains: new work is refused everywhere at once, the streams
  in flight (OpenAI's and gRPC's) run to their end, then everything stops, within the
  grace period and without leftovers.
"""

from __future__ import annotations

import json
import re
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
from tritonforge.engines.config import load_engine_config
from tritonforge.launch.launcher import MODEL_REPOSITORY, answers, session_processes
from tritonforge.launch.supervisor import shm_regions

MODEL = "llamacpp_model"
RUNTIME_MODEL = "preprocessing"  # C++ tokenizer model: loads in well under a second
SLOTS = load_engine_config(MODEL_REPOSITORY / MODEL / "1", "model.json")["n_parallel"]
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
    base: str,
    stream_it: bool,
    max_tokens: int,
    client_timeout_s: float = 60,
    headers: dict[str, str] | None = None,
    **extra: object,
) -> requests.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": max_tokens,
        "stream": stream_it,
        **extra,
    }
    return requests.post(
        f"{base}/chat/completions",
        json=body,
        stream=stream_it,
        timeout=client_timeout_s,
        headers=headers,
    )


class Queued(threading.Thread):
    """An OpenAI request (``X-Request-Id`` ``request_id``) sent on a thread of its own;
    its reply (the whole body read) or the exception it raised."""

    def __init__(self, base: str, request_id: str, stream_it: bool, **extra: object) -> None:
        super().__init__()
        self.args_ = (base, stream_it, 8)
        self.extra = {"ignore_eos": True, **extra}
        self.headers = {"X-Request-Id": request_id}
        self.reply: requests.Response | None = None
        self.events: list[dict] = []
        self.error: Exception | None = None
        self.start()

    def run(self) -> None:
        try:
            reply = _chat(*self.args_, client_timeout_s=300, headers=self.headers, **self.extra)
            if reply.status_code == 200 and self.args_[1]:
                lines = reply.iter_lines(decode_unicode=True)
                data = [x.removeprefix("data: ") for x in lines if x.startswith("data: ")]
                assert data[-1] == "[DONE]", data[-3:]
                self.events = [json.loads(x) for x in data[:-1]]
            self.reply = reply
        except Exception as error:  # the test reads it
            self.error = error


def _openai_stream(base: str, started: threading.Event, events: list[str]) -> None:
    with _chat(base, True, 1000, ignore_eos=True) as reply:  # still generating at the kill
        assert reply.status_code == 200
        for line in reply.iter_lines(decode_unicode=True):
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
                started.set()


def _in_flight(launched: Launcher) -> tuple[threading.Thread, list[Hold], list[str]]:
    """An OpenAI stream and gRPC streams, all generating, in every slot of the model."""
    openai_events: list[str] = []
    openai_started = threading.Event()
    openai = threading.Thread(
        target=_openai_stream, args=(launched.openai_url, openai_started, openai_events)
    )
    openai.start()
    assert openai_started.wait(60), "the OpenAI stream never started"
    holds = [
        Hold(launched.server.grpc_url, MODEL, f"Once upon a time {i}") for i in range(SLOTS - 1)
    ]
    for hold in holds:
        hold.wait_responses()
    return openai, holds, openai_events


def _waiting(launched: Launcher) -> float:
    return metric(launched.server.metrics_url, "llamacpp:num_requests_waiting", model=MODEL)


def _whole_answer(queued: Queued, request_id: str) -> None:
    """Answered after the restart, under the id it was sent with; a stream from its
    first token: one beginning, no error event, all 8 tokens."""
    queued.join(300)
    assert not queued.is_alive() and queued.error is None, queued.error
    assert queued.reply is not None and queued.reply.status_code == 200, queued.reply.text
    assert queued.reply.headers["x-request-id"] == request_id
    if not queued.events:
        answer = queued.reply.json()
        assert answer["usage"]["completion_tokens"] == 8
        assert answer["choices"][0]["message"]["content"]
        return
    assert not [e for e in queued.events if "error" in e], queued.events
    chunks = [e for e in queued.events if e["choices"]]
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    assert sum(bool(c["choices"][0]["delta"].get("role")) for c in chunks) == 1
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert queued.events[-1]["usage"]["completion_tokens"] == 8


def test_a_killed_tritonserver_is_back_and_the_frontend_carried_its_requests_over(
    launched,
) -> None:
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
    openai, holds, openai_events = _in_flight(launched)
    single = Queued(launched.openai_url, "queued-single-1", False, timeout_s=240)
    streamed = Queued(
        launched.openai_url, "queued-stream-1", True, stream_options={"include_usage": True}
    )
    wait_for(lambda: _waiting(launched) == 2, what="both OpenAI requests queued in the model")

    dead.kill()
    killed = time.monotonic()
    openai.join(30)
    for hold in holds:
        hold.wait_end(30)
        hold.cancel()
    assert not openai.is_alive(), "a stream in flight hung after the crash"
    assert all(hold.error is not None for hold in holds)  # Triton's port died with it
    assert openai_events[-1] == "[DONE]"
    error = json.loads(openai_events[-2])["error"]
    assert error["code"] == "server_restarted", error
    sent = re.search(
        r"tritonserver restarted after this stream had sent (\d+) tokens", error["message"]
    )
    assert sent is not None and int(sent.group(1)) >= 1, error["message"]  # it had started
    wait_for(
        lambda: (
            requests.get(f"{launched.openai_url.removesuffix('/v1')}/health").status_code == 503
        ),
        what="the frontend to see Triton down",
    )
    during = Queued(launched.openai_url, "during-outage-1", False)

    for queued, request_id in (
        (single, "queued-single-1"),
        (streamed, "queued-stream-1"),
        (during, "during-outage-1"),
    ):
        _whole_answer(queued, request_id)
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


class Streamed(threading.Thread):
    """An OpenAI stream of ``DRAIN_TOKENS`` forced tokens; each event with its arrival."""

    def __init__(self, base: str) -> None:
        super().__init__()
        self.base = base
        self.events: list[tuple[float, str]] = []
        self.started = threading.Event()
        self.error: Exception | None = None
        self.start()

    def run(self) -> None:
        try:
            with _chat(self.base, True, DRAIN_TOKENS, ignore_eos=True) as reply:
                assert reply.status_code == 200, reply.text
                for line in reply.iter_lines(decode_unicode=True):
                    if line.startswith("data: "):
                        self.events.append((time.monotonic(), line.removeprefix("data: ")))
                        self.started.set()
        except Exception as error:  # the test reads it
            self.error = error
        finally:
            self.started.set()


#: Forced tokens of each request in flight at the SIGTERM: long enough to be running
#: when it arrives, short enough to finish well within the 30 s grace period.
DRAIN_TOKENS = 128


def _refused_by_triton(launched: Launcher) -> bool:
    """A new gRPC request to the model is refused as the server stops (a 2-token request
    that is still accepted, in the second before the model notices, runs to its end)."""
    with Hold(launched.server.grpc_url, MODEL, "Hi", {"max_tokens": 2}) as probe:
        probe.wait_end(30)
    return probe.error is not None and bool(
        re.search(r"shutting down|no available versions", str(probe.error))
    )


@pytest.mark.speed  # premise: the requests are still generating when the SIGTERM arrives
def test_sigterm_drains_the_requests_in_flight_then_stops_everything(launched) -> None:
    """SIGTERM to the launcher with OpenAI streams (through the frontend) and gRPC streams
    (straight to Triton) generating: new work is refused everywhere and readiness drops,
    every stream in flight runs to its final response or ``[DONE]``, and the launcher
    exits within its grace period leaving no process or shared memory behind."""
    wait_for(lambda: _serves(launched), timeout_s=180, what="the server to serve")
    deaths_before = launched.log.read_text(errors="replace").count("tritonserver died")
    tree = psutil.Process(launched.process.pid).children(recursive=True)
    regions = shm_regions(launched.triton().pid)
    openai = [Streamed(launched.openai_url) for _ in range(2)]
    sampling = {"max_tokens": DRAIN_TOKENS, "temperature": 0, "ignore_eos": True}
    grpc = [
        Hold(launched.server.grpc_url, MODEL, f"Once upon a time {i}", sampling) for i in (1, 2)
    ]
    for stream in openai:
        assert stream.started.wait(60) and stream.error is None, stream.error
    for hold in grpc:
        hold.wait_responses()
    launched.process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()

    health = launched.openai_url.removesuffix("/v1") + "/health"
    wait_for(lambda: not answers(launched.server.ready_url, timeout_s=1), what="Triton unready")
    wait_for(lambda: not answers(health, range(100, 600), 1), what="the frontend's port closed")
    with pytest.raises(requests.ConnectionError):
        _chat(launched.openai_url, False, 2)
    wait_for(lambda: _refused_by_triton(launched), timeout_s=30, what="Triton to refuse")

    for hold in grpc:
        hold.wait_end(60)
        hold.cancel()  # a stream left open would hold the model until the exit timeout
        assert hold.error is None, hold.error  # ended by its final response
        assert hold.times[-1] > signalled  # it was still running at the signal
    for stream in openai:
        stream.join(60)
        assert not stream.is_alive() and stream.error is None, stream.error
        assert stream.events[-1][1] == "[DONE]"
        chunks = [json.loads(data) for _, data in stream.events[:-1]]
        assert not [c for c in chunks if "error" in c], chunks[-2:]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert stream.events[-1][0] > signalled  # it was still running at the signal
    assert launched.process.wait(timeout=30) == 0  # within the grace period
    psutil.wait_procs(tree, timeout=10)
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert regions and not [r for r in regions if Path(r).exists()]  # nor shared memory
    log = launched.log.read_text(errors="replace")
    assert log.count("tritonserver died") == deaths_before  # the stop is not a death
    assert "Exit timeout expired" not in log  # Triton drained and unloaded in time
