"""The OpenAI routes beside the completions: one model's card, readiness, metrics.

A fake gateway stands for Triton; ``/metrics`` reads a small local HTTP server standing
for Triton's metrics endpoint.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from tests.unit.openai.test_openai_translate import FakeGateway
from tritonforge.openai.__main__ import default_metrics_url
from tritonforge.openai.app import create_app

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
