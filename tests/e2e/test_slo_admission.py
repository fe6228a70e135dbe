"""SLO admission and priorities end to end: real tritonserver, real vLLM (vllm_slo_model).

vllm_slo_model ships with admission on (refusing only after 4 calibrating first
tokens) and vLLM's priority scheduler with two sequences at most. A request whose SLO
cannot be met is refused at once, naming the prediction, over gRPC, HTTP and the OpenAI
frontend; requests without an SLO run whatever the queue; a high-priority request
arriving behind a queue starts before a low-priority one that arrived first. The model
runs on a server of its own (OWN_SERVER_MODELS in tests/conftest.py).
"""

from __future__ import annotations

import threading
import time

import pytest
import requests

from tests.e2e.client import generate, llm_inputs, metric, own_server_frontend, stream
from tritonforge.launch.launcher import OpenAIFrontend, TritonServer

MODEL = "vllm_slo_model"
#: No prefill on this machine takes a millisecond: a 1 ms TTFT SLO is never attainable.
IMPOSSIBLE = {"slo_ttft_ms": 1}
REFUSAL = "SLO admission refused the request: predicted TTFT"

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """The model on a server of its own, calibrated by a few requests without an SLO."""
    log = tmp_path_factory.mktemp("slo") / "server.log"
    with TritonServer.on_free_ports(models=[MODEL], log_path=log) as own:
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
    time.sleep(0.3)  # the counters are exported every poll interval (0.1 s)
    assert refused(server) == before + 1


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


def test_requests_without_an_slo_are_untouched(server: TritonServer) -> None:
    """Behind a queue that would refuse any SLO, a request without one still runs."""
    hold = {"max_tokens": 24, "ignore_eos": True}
    queue = [
        threading.Thread(
            target=stream, args=(server.grpc_url, MODEL, llm_inputs("Tell a story", hold))
        )
        for _ in range(3)
    ]
    for thread in queue:
        thread.start()
    try:
        time.sleep(0.5)
        answer = generate(server.http_url, MODEL, {"text_input": "Hi", "parameters": {}})
        assert "error" not in answer and answer["text_output"]
        again = stream(server.grpc_url, MODEL, llm_inputs("Hello", IMPOSSIBLE))
        assert REFUSAL in str(again.error)  # the same queue refuses an impossible SLO
    finally:
        for thread in queue:
            thread.join(timeout=300)
    assert metric(server.metrics_url, "vllm:admission_decisions_total", decision="no_slo") >= 6


def test_a_high_priority_request_behind_a_queue_starts_first(server: TritonServer) -> None:
    """Two long requests fill both sequences; then a low-priority request arrives, then a
    high-priority one: when the first slot frees, vLLM's priority scheduler starts the high
    one. The holds differ in length, so one slot frees at a time: two freed in the same
    step would start both waiting requests together and leave their order to chance."""
    first_token: dict[str, float] = {}

    def run(name: str, sampling: dict) -> None:
        def seen(count: int) -> None:
            first_token.setdefault(name, time.monotonic())

        answer = stream(server.grpc_url, MODEL, llm_inputs("Count", sampling), on_response=seen)
        assert answer.error is None, answer.error

    holds = [{"max_tokens": 64, "ignore_eos": True}, {"max_tokens": 160, "ignore_eos": True}]
    short = {"max_tokens": 4, "ignore_eos": True}
    threads = [
        threading.Thread(target=run, args=(f"hold{i}", hold)) for i, hold in enumerate(holds)
    ]
    for thread in threads:
        thread.start()
    time.sleep(1.0)  # both holds are running
    late = [("low", {**short, "priority": 10}), ("high", {**short, "priority": -10})]
    for name, sampling in late:
        threads.append(threading.Thread(target=run, args=(name, sampling)))
        threads[-1].start()
        time.sleep(0.3)  # the low one is queued first
    for thread in threads:
        thread.join(timeout=300)
    assert first_token["high"] < first_token["low"], first_token
