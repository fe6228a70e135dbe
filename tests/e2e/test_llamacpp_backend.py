"""llamacpp_model specifics: one context, a bounded FIFO queue, abort while queued.

llama.cpp runs one sequence at a time per context. The model therefore runs one
request and queues the rest (FIFO) up to max_inflight (8 in config.pbtxt); past that a
request gets an UNAVAILABLE "busy" error at once. These tests hold the context busy
with a long request so the queue's state is deterministic, not a race.
"""

from __future__ import annotations

import json
import queue
from concurrent.futures import ThreadPoolExecutor

import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.client import llm_inputs, metric, stream, wait_for
from tritonforge.engines.config import load_engine_config
from tritonforge.launch.launcher import MODEL_REPOSITORY

MODEL = "llamacpp_model"
LONG = {"temperature": 0, "max_tokens": 1500, "ignore_eos": True}
SHORT = {"temperature": 0, "max_tokens": 8, "ignore_eos": True}

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def server(triton_server):
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    if not client.is_model_ready(MODEL):
        pytest.skip(f"{MODEL} is not loaded (llama-cpp-python missing?)")
    client.close()
    return triton_server


def gauge(server, name: str) -> float:
    return metric(server.metrics_url, f"llamacpp:{name}", model=MODEL)


def cancelled(server) -> float:
    return metric(
        server.metrics_url, "llamacpp:request_outcome_total", model=MODEL, outcome="cancelled"
    )


class OpenStream:
    """A request on its own gRPC stream that the test cancels when it chooses."""

    def __init__(self, server, prompt: str, sampling: dict, on_first=None) -> None:
        self.events: queue.Queue = queue.Queue()
        self.on_first = on_first
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.client.start_stream(callback=self._received)
        self.client.async_stream_infer(MODEL, llm_inputs(prompt, sampling=sampling))
        self.open = True

    def _received(self, result, error) -> None:
        if self.on_first is not None:
            self.on_first()
            self.on_first = None
        self.events.put((result, error))

    def first_response(self) -> None:
        _, error = self.events.get(timeout=120)
        assert error is None, error

    def cancel(self) -> None:
        if self.open:
            self.open = False
            self.client.stop_stream(cancel_requests=True)
            self.client.close()


def test_queue_is_bounded_and_refuses_past_max_inflight(server) -> None:
    max_inflight, sent = 8, 10
    wait_for(lambda: gauge(server, "num_requests_running") == 0, what="an idle engine")
    blocker = OpenStream(server, "Tell a very long story:", LONG)
    try:
        blocker.first_response()  # the context is now busy with the blocker
        inputs = [
            llm_inputs(f"Item {i}:", sampling=SHORT, return_num_output_tokens=True)
            for i in range(sent)
        ]
        with ThreadPoolExecutor(sent) as pool:
            futures = [pool.submit(stream, server.grpc_url, MODEL, i) for i in inputs]
            # 1 running + 7 queued fill max_inflight; the other 3 are refused at once.
            refused_count = sent - (max_inflight - 1)
            wait_for(lambda: sum(f.done() for f in futures) == refused_count,
                     what="the requests past the bound to be refused")  # fmt: skip
            wait_for(lambda: gauge(server, "num_requests_waiting") == max_inflight - 1,
                     what="7 queued requests")  # fmt: skip
            assert gauge(server, "num_requests_running") == 1
            blocker.cancel()  # frees the context: the queue drains
        results = [f.result() for f in futures]
    finally:
        blocker.cancel()
    refused = [str(r.error) for r in results if r.error is not None]
    served = [r for r in results if r.error is None]
    assert len(refused) == refused_count
    assert all("model is busy: 8 requests in flight" in e for e in refused), refused
    assert len(served) == max_inflight - 1
    assert all(sum(int(n[0]) for n in r.outputs("num_output_tokens")) == 8 for r in served)
    wait_for(lambda: gauge(server, "num_requests_waiting") == 0, what="an empty queue")
    wait_for(lambda: gauge(server, "num_requests_running") == 0, what="an idle engine")


def test_queued_requests_run_in_arrival_order(server) -> None:
    wait_for(lambda: gauge(server, "num_requests_running") == 0, what="an idle engine")
    order: list[int] = []
    blocker = OpenStream(server, "Tell a very long story:", LONG)
    queued = []
    try:
        blocker.first_response()
        for i in range(3):
            queued.append(
                OpenStream(server, f"Item {i}:", SHORT, on_first=lambda i=i: order.append(i))
            )
            wait_for(lambda n=i + 1: gauge(server, "num_requests_waiting") == n,
                     what=f"{i + 1} queued")  # fmt: skip
        blocker.cancel()
        for request in queued:
            request.first_response()
    finally:
        blocker.cancel()
        for request in queued:
            request.cancel()
    assert order == [0, 1, 2]


def test_request_cancelled_while_queued_never_runs(server) -> None:
    wait_for(lambda: gauge(server, "num_requests_running") == 0, what="an idle engine")
    before = cancelled(server)
    blocker = OpenStream(server, "Tell a very long story:", LONG)
    try:
        blocker.first_response()
        queued = OpenStream(server, "Another long story:", LONG)
        wait_for(lambda: gauge(server, "num_requests_waiting") == 1, what="one queued request")
        queued.cancel()
        wait_for(lambda: cancelled(server) == before + 1, what="the queued request cancelled")
        wait_for(lambda: gauge(server, "num_requests_waiting") == 0, what="an empty queue")
        # The blocker was never interrupted: it still holds the context.
        assert gauge(server, "num_requests_running") == 1
    finally:
        blocker.cancel()
    wait_for(lambda: cancelled(server) == before + 2, what="the blocker cancelled")
    wait_for(lambda: gauge(server, "num_requests_running") == 0, what="an idle engine")


def test_engine_config_is_llama_keyword_arguments() -> None:
    config = load_engine_config(MODEL_REPOSITORY / MODEL / "1", "model.json")
    assert config["model_path"] == "$TRITONFORGE_GGUF"
    assert json.dumps(config)  # plain JSON, no engine objects


def test_grammar_the_engine_cannot_parse_is_a_request_error(server) -> None:
    bad = {"max_tokens": 4, "structured_outputs": {"grammar": "root ::= ("}}
    result = stream(server.grpc_url, MODEL, llm_inputs("hi", sampling=bad))
    assert "structured_outputs.grammar: llama.cpp could not parse the grammar" in str(result.error)
    ok = stream(server.grpc_url, MODEL, llm_inputs("Hi", sampling=SHORT))
    assert ok.error is None and ok.text
