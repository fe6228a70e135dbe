"""SLO admission and priorities end to end: real tritonserver, real vLLM (vllm_slo_model).

vllm_slo_model ships with admission on (refusing only after 4 calibrating first
tokens) and vLLM's priority scheduler with two sequences at most. A request whose SLO
cannot be met is refused at once, naming the prediction, over gRPC, HTTP and the OpenAI
frontend; requests without an SLO run whatever the queue; a high-priority request
arriving behind a queue starts before a low-priority one that arrived first. Queues are
built with holds (requests the test cancels) and the engine's own gauges, never timed.
The model runs on a server of its own (OWN_SERVER_MODELS in tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.e2e.client import (
    Hold,
    generate,
    llm_inputs,
    metric,
    own_server_frontend,
    stream,
    wait_for,
)
from tritonforge.launch.launcher import OpenAIFrontend, TritonServer

MODEL = "vllm_slo_model"
#: No prefill on this machine takes a millisecond: a 1 ms TTFT SLO is never attainable.
IMPOSSIBLE = {"slo_ttft_ms": 1}
REFUSAL = "SLO admission refused the request: predicted TTFT"
#: A request that outlasts any test here (the model's context is 1,024 tokens).
HOLD = {"temperature": 0, "max_tokens": 900, "ignore_eos": True}

pytestmark = [pytest.mark.server, pytest.mark.speed]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, served_repository: Path):
    """The model on a server of its own, calibrated by a few requests without an SLO."""
    log = tmp_path_factory.mktemp("slo") / "server.log"
    with TritonServer.on_free_ports(
        repository=served_repository, models=[MODEL], log_path=log
    ) as own:
        for _ in range(5):
            answer = stream(own.grpc_url, MODEL, llm_inputs("Hello there", {"max_tokens": 2}))
            assert answer.error is None, answer.error
        yield own


openai = own_server_frontend("slo")


def refused(server: TritonServer) -> float:
    return metric(server.metrics_url, "vllm:admission_decisions_total", decision="refused_ttft")


def test_grpc_refusal_names_the_prediction_and_the_slo(server: TritonServer) -> None:
    before = refused(server)
    answer = stream(server.grpc_url, MODEL, llm_inputs("Hello", IMPOSSIBLE))
    assert answer.error is not None and not answer.responses
    assert REFUSAL in str(answer.error) and "exceeds slo_ttft_ms 1 ms" in str(answer.error)
    # The counters are exported every poll interval.
    wait_for(lambda: refused(server) == before + 1, timeout_s=10, what="the refusal counted")


def test_http_refusal_names_the_prediction(server: TritonServer) -> None:
    """The model answers UNAVAILABLE; Triton 2.51's /generate answers 400 to any model
    error whatever its code, so the message is what an HTTP client can act on."""
    reply = requests.post(
        f"http://{server.http_url}/v2/models/{MODEL}/generate",
        json={"text_input": "Hello", "parameters": IMPOSSIBLE},
        timeout=60,
    )
    assert reply.status_code == 400, reply.text
    assert REFUSAL in reply.json()["error"] and "retry after" in reply.json()["error"]


def test_openai_refusal_is_429_with_retry_after(openai: OpenAIFrontend) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    by_header = requests.post(
        f"{openai.base_url}/chat/completions",
        json=body,
        headers={"x-slo-ttft-ms": "1"},
        timeout=60,
    )
    by_body = requests.post(
        f"{openai.base_url}/chat/completions", json={**body, **IMPOSSIBLE}, timeout=60
    )
    for reply in (by_header, by_body):
        assert reply.status_code == 429, reply.text
        assert int(reply.headers["Retry-After"]) >= 1
        assert REFUSAL in reply.json()["error"]["message"]
    generous = requests.post(
        f"{openai.base_url}/chat/completions",
        json=body,
        headers={"x-slo-ttft-ms": "600000"},
        timeout=120,
    )
    assert generous.status_code == 200, generous.text


def gauge(server: TritonServer, name: str) -> float:
    return metric(server.metrics_url, f"vllm:{name}", model=MODEL)


def no_slo(server: TritonServer) -> float:
    return metric(server.metrics_url, "vllm:admission_decisions_total", decision="no_slo")


@contextlib.contextmanager
def both_sequences_held(server: TritonServer, queued: int = 0) -> Iterator[list[Hold]]:
    """Two holds run (the model's two sequences) and ``queued`` more wait behind them,
    until the block ends or the test cancels them."""
    wait_for(lambda: gauge(server, "num_requests_running") == 0, what="an idle engine")
    holds: list[Hold] = []
    try:
        for i in range(2):
            holds.append(Hold(server.grpc_url, MODEL, f"Tell a long story, part {i}:", HOLD))
            holds[-1].wait_responses()
        for i in range(queued):
            holds.append(Hold(server.grpc_url, MODEL, f"Another story, part {i}:", HOLD))
        wait_for(lambda: gauge(server, "num_requests_running") == 2, what="both sequences busy")
        wait_for(lambda: gauge(server, "num_requests_waiting") == queued, what=f"{queued} queued")
        yield holds
    finally:
        for hold in holds:
            hold.cancel()


def test_requests_without_an_slo_are_untouched(server: TritonServer) -> None:
    """Behind a queue that refuses any SLO, a request without one is admitted: it waits
    its turn and runs once the queue moves."""
    before = no_slo(server)
    with both_sequences_held(server, queued=1) as holds, ThreadPoolExecutor(1) as pool:
        plain = pool.submit(
            generate, server.http_url, MODEL, {"text_input": "Hi", "parameters": {}}
        )
        wait_for(lambda: gauge(server, "num_requests_waiting") == 2, what="it queued, admitted")
        again = stream(server.grpc_url, MODEL, llm_inputs("Hello", IMPOSSIBLE))
        assert REFUSAL in str(again.error)  # the same queue refuses an impossible SLO
        for hold in holds:
            hold.cancel()  # the queue moves
        answer = plain.result(timeout=300)
    assert "error" not in answer and answer["text_output"]
    wait_for(lambda: no_slo(server) >= before + 4, timeout_s=10, what="4 admissions counted")


def test_a_high_priority_request_behind_a_queue_starts_first(server: TritonServer) -> None:
    """Two holds fill both sequences; a low-priority request queues, then a high-priority
    one queues behind it. When one hold is cancelled, vLLM's priority scheduler gives the
    free sequence to the high one."""
    first_token: dict[str, float] = {}

    def run(name: str, sampling: dict) -> None:
        def seen(count: int) -> None:
            first_token.setdefault(name, time.monotonic())

        answer = stream(server.grpc_url, MODEL, llm_inputs("Count", sampling), on_response=seen)
        assert answer.error is None, answer.error

    short = {"max_tokens": 4, "ignore_eos": True}
    late = [("low", {**short, "priority": 10}), ("high", {**short, "priority": -10})]
    with both_sequences_held(server) as holds, ThreadPoolExecutor(len(late)) as pool:
        answers = []
        for queued, (name, sampling) in enumerate(late, start=1):
            answers.append(pool.submit(run, name, sampling))
            wait_for(
                lambda n=queued: gauge(server, "num_requests_waiting") == n,
                what=f"{name} queued",
            )
        holds[0].cancel()  # one sequence frees: the high one takes it
        for answer in answers:
            answer.result(timeout=300)
    assert first_token["high"] < first_token["low"], first_token
