"""The OpenAI frontend while Triton is down: every route answers 503 with Retry-After.

The real gateway (grpc.aio channel) against a port where nothing listens — what the
frontend sees while the launcher restarts a crashed tritonserver. Chat and completions
answer 503 at once here because this frontend never read the model's config (it cannot
tell the model exists); a request to a model it served before the outage waits for the
restarted server instead (tests/unit/openai/test_carry_over.py). That it serves again
once Triton is back is tests/e2e/test_crash_recovery.py's part.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tritonforge.launch.launcher import free_port
from tritonforge.openai.app import create_app
from tritonforge.openai.errors import TRITON_DOWN_RETRY_AFTER_S, from_triton

CHAT = {"model": "llm", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def down() -> TestClient:
    with TestClient(create_app(f"127.0.0.1:{free_port()}")) as client:
        yield client


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/v1/chat/completions", CHAT),
        ("post", "/v1/chat/completions", CHAT | {"stream": True}),
        ("post", "/v1/completions", {"model": "llm", "prompt": "x"}),
        ("get", "/v1/models", None),
        ("post", "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/a"}),
        ("post", "/v1/unload_lora_adapter", {"lora_name": "a"}),
        ("get", "/health", None),
    ],
)
def test_every_route_answers_503_with_retry_after(down, method, path, body) -> None:
    reply = down.request(method.upper(), path, json=body)
    assert reply.status_code == 503
    assert reply.headers["retry-after"] == str(TRITON_DOWN_RETRY_AFTER_S)
    error = reply.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "service_unavailable"
    assert "not reachable" in error["message"] or "not ready" in error["message"]


def test_a_busy_model_asks_for_a_shorter_wait() -> None:
    busy = from_triton("vllm_model is busy: 64 requests in flight", "vllm_model")
    assert busy.status == 503 and busy.retry_after_s is not None
    assert busy.retry_after_s < TRITON_DOWN_RETRY_AFTER_S
    assert from_triton("text_input: must not be empty", "m").retry_after_s is None
