"""A dead engine is noticed, its requests end, the model goes unready and comes back.

On a server of its own (it kills vllm_model's engine): SIGKILL of vLLM's engine-core
process under load → every request in flight gets an UNAVAILABLE error naming the
failure, the model reports not ready within 5 s, serves the same greedy answer again
within 90 s with no operator action, counts the restart, and leaves no process behind.
"""

from __future__ import annotations

import contextlib
import threading
import time

import psutil
import pytest
import requests

from tests.e2e.client import LONG_GREEDY, generate, llm_inputs, metric, stream, wait_for
from tritonforge.launch.launcher import TritonServer

MODEL = "vllm_model"
GREEDY = {"temperature": 0, "max_tokens": 12, "ignore_eos": True}
pytestmark = [pytest.mark.server, pytest.mark.last]


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("restart") / "server.log"
    with TritonServer.on_free_ports(models=[MODEL], log_path=log) as server:
        yield server


def _ready(server) -> bool:
    with contextlib.suppress(requests.RequestException):
        reply = requests.get(f"http://{server.http_url}/v2/models/{MODEL}/ready", timeout=5)
        return reply.status_code == 200
    return False


def _stub_and_engine(server) -> tuple[psutil.Process, psutil.Process]:
    """vllm_model's stub process and the vLLM engine-core process it started."""
    for proc in server.descendants():
        with contextlib.suppress(psutil.Error):
            if "triton_python_backend_stub" in proc.cmdline()[0] and any(
                f"/{MODEL}/" in part for part in proc.cmdline()
            ):
                for child in proc.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        if "EngineCore" in child.name() or "EngineCore" in " ".join(
                            child.cmdline()
                        ):
                            return proc, child
    raise AssertionError("no vLLM engine-core process under vllm_model's stub")


def _answer(server) -> str:
    body = {"text_input": "The three primary colours are", "parameters": GREEDY}
    return generate(server.http_url, MODEL, {**body, "exclude_input_in_output": True})[
        "text_output"
    ]


def test_engine_killed_under_load_is_restarted(own_server) -> None:
    server = own_server
    before = _answer(server)  # derived here: greedy text differs between CPUs
    stub, engine = _stub_and_engine(server)

    results: list = []
    streaming = threading.Semaphore(0)

    def one(i: int) -> None:
        results.append(
            stream(
                server.grpc_url,
                MODEL,
                llm_inputs(f"Story {i}:", sampling=LONG_GREEDY),
                on_response=lambda n: n == 1 and streaming.release(),
                timeout_s=60,
            )
        )

    workers = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for worker in workers:
        worker.start()
    for _ in workers:
        assert streaming.acquire(timeout=60), "the requests never started streaming"

    engine.kill()
    killed_at = time.monotonic()
    wait_for(lambda: not _ready(server), timeout_s=5, what="the model to report not ready")
    for worker in workers:
        worker.join(30)
    assert not any(w.is_alive() for w in workers), "a request in flight hung"
    assert len(results) == 4
    for result in results:
        assert result.error is not None, "a request in flight ended without an error"
        # A gRPC stream carries the error's message, not its code (Triton 2.51).
        assert "engine failed" in str(result.error), result.error

    wait_for(lambda: _ready(server), timeout_s=90, what="the model to be ready again")
    back_after = time.monotonic() - killed_at
    assert _answer(server) == before, f"(back after {back_after:.0f} s)"
    assert metric(server.metrics_url, "vllm:engine_restarts_total", model=MODEL) == 1
    wait_for(
        lambda: (
            not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in (stub, engine))
        ),
        timeout_s=30,
        what="the old stub and engine to exit",
    )
