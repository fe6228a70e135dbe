"""The OpenAI routes beside the completions: one model's card, readiness, metrics.

A fake gateway stands for Triton; ``/metrics`` reads a small local HTTP server standing
for Triton's metrics endpoint.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.unit.openai.test_openai_translate import FakeGateway, conforms, sse_events
from tritonforge.openai.__main__ import default_metrics_url
from tritonforge.openai.app import create_app
from tritonforge.openai.responses import ChatCompletionChunk, Completion
from tritonforge.openai.translate import ModelOutput

PAGE = b"# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total 3\n"


class _NoModels(FakeGateway):
    async def served_models(self) -> list[str]:
        return []


class _Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args: object) -> None: ...


@pytest.fixture
def metrics_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def _client(gateway: FakeGateway, metrics: str | None = None) -> TestClient:
    app = create_app("fake:1", 99, gateway=gateway, triton_metrics=metrics)  # type: ignore[arg-type]
    return TestClient(app)


def test_one_models_card_or_404_as_openai() -> None:
    client = _client(FakeGateway())
    card = client.get("/v1/models/llm")
    assert card.status_code == 200
    assert card.json()["id"] == "llm" and card.json()["object"] == "model"
    missing = client.get("/v1/models/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_health_and_readiness_follow_the_models_served() -> None:
    ready = _client(FakeGateway())
    assert ready.get("/health").json() == {"status": "ok"}
    assert ready.get("/health/ready").json() == {"status": "ok", "models": ["llm"]}
    none = _client(_NoModels())
    for route in ("/health", "/health/ready"):
        reply = none.get(route)
        assert reply.status_code == 503 and "retry-after" in reply.headers
        assert "no model" in reply.json()["error"]["message"]


def test_metrics_serves_tritons_page_on_the_api_port(metrics_url: str) -> None:
    reply = _client(FakeGateway(), metrics_url).get("/metrics")
    assert reply.status_code == 200 and reply.content == PAGE
    assert reply.headers["content-type"].startswith("text/plain")


def test_metrics_answers_503_while_triton_does_not() -> None:
    reply = _client(FakeGateway(), "http://127.0.0.1:9/metrics").get("/metrics")
    assert reply.status_code == 503


def test_the_default_metrics_url_sits_beside_the_grpc_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TRITON_METRICS_PORT", raising=False)
    assert default_metrics_url("10.0.0.5:8001") == "http://10.0.0.5:8002/metrics"
    monkeypatch.setenv("TRITON_METRICS_PORT", "9102")
    assert default_metrics_url("localhost:7001") == "http://localhost:9102/metrics"


# --- n > 1: one request to the model, n choices back ------------------------------------


def _two(a: str, b: str, reasons: tuple[str, str], counts: tuple[int, int], final: bool = False):
    choices = [
        ModelOutput(text, reason, None, count)
        for text, reason, count in zip((a, b), reasons, counts, strict=True)
    ]
    return ModelOutput(
        num_input_tokens=4, num_output_tokens=sum(counts), choices=choices, final=final
    )


def _two_sequences() -> list[ModelOutput]:
    return [
        _two("Hel", "Bon", ("None", "None"), (1, 1)),
        _two("lo", "", ("length", "None"), (1, 0)),
        _two("", "jour", ("None", "stop"), (0, 1), final=True),
    ]


def test_n_choices_in_one_answer_with_usage_summed() -> None:
    gateway = FakeGateway(_two_sequences())
    body = {"model": "llm", "prompt": "x", "n": 2, "max_tokens": 2}
    reply = _client(gateway).post("/v1/completions", json=body)
    answer = conforms(reply.text, Completion)
    assert [(c["index"], c["text"], c["finish_reason"]) for c in answer["choices"]] == [
        (0, "Hello", "length"),
        (1, "Bonjour", "stop"),
    ]
    assert answer["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}
    assert gateway.sent[0]["n"] == 2  # one request to the model, which samples n


def test_n_choices_stream_each_under_its_index() -> None:
    body = {
        "model": "llm",
        "messages": [{"role": "user", "content": "hi"}],
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    reply = _client(FakeGateway(_two_sequences())).post("/v1/chat/completions", json=body)
    events = sse_events(reply.text)
    assert events[-1] == "[DONE]"
    chunks = [conforms(e, ChatCompletionChunk) for e in events[:-1]]
    text = {0: "", 1: ""}
    ends = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        text[choice["index"]] += choice["delta"].get("content") or ""
        if choice["finish_reason"]:
            ends[choice["index"]] = choice["finish_reason"]
    assert text == {0: "Hello", 1: "Bonjour"} and ends == {0: "length", 1: "stop"}
    assert chunks[-1]["usage"]["completion_tokens"] == 4


def test_n_with_tool_calls_is_a_400_naming_n() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    body = {"model": "llm", "messages": [{"role": "user", "content": "hi"}], "n": 2}
    reply = _client(FakeGateway()).post("/v1/chat/completions", json=body | {"tools": [tool]})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "n"


def test_a_response_of_n_sequences_is_read_per_sequence() -> None:
    from tritonclient.grpc import service_pb2
    from tritonclient.utils import serialize_byte_tensor

    from tritonforge.openai.triton_client import parse_response

    def texts(*values: str) -> bytes:
        return serialize_byte_tensor(
            np.array([v.encode() for v in values], dtype=np.object_)
        ).item()

    response = service_pb2.ModelInferResponse()
    tensors = {
        "text_output": ("BYTES", [2], texts("a", "bc")),
        "finish_reason": ("BYTES", [2], texts("None", "stop")),
        "num_input_tokens": ("UINT32", [1], np.array([7], dtype=np.uint32).tobytes()),
        "num_output_tokens": ("UINT32", [2], np.array([1, 2], dtype=np.uint32).tobytes()),
    }
    for name, (datatype, shape, raw) in tensors.items():
        response.outputs.add(name=name, datatype=datatype, shape=shape)
        response.raw_output_contents.append(raw)
    output = parse_response(response)
    assert output.choices is not None
    assert [(c.text, c.finish_reason, c.num_output_tokens) for c in output.choices] == [
        ("a", "None", 1),
        ("bc", "stop", 2),
    ]
    assert (output.num_input_tokens, output.num_output_tokens, output.final) == (7, 3, False)
