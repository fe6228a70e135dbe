"""The OpenAI frontend frees each request's gRPC call when the request ends.

A call left suspended after its last response sits in a reference cycle with its own
response reader: it, its tasks and gRPC core's memory for it then wait for the cyclic
garbage collector, and under load the frontend's RSS saws up and down with the
collector's rhythm. With the collector off, no call may be left once the requests are
answered — answered in full, streamed, or refused by the model.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from fastapi.testclient import TestClient

from tests.e2e.client import model_ready
from tritonforge.launch.launcher import TritonServer
from tritonforge.openai.app import create_app

MODEL = "synthetic_model"
CHAT = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
COMPLETION = {"model": MODEL, "max_tokens": 8, "prompt": "Rivers are"}

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def client(triton_server: TritonServer) -> Iterator[TestClient]:
    if not model_ready(triton_server, MODEL):
        pytest.skip(f"{MODEL} is not loaded")
    with TestClient(create_app(triton_server.grpc_url)) as client:
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200  # connected
        yield client


def live_calls() -> int:
    return sum(isinstance(o, grpc.aio.Call) for o in gc.get_objects())


@pytest.mark.parametrize(
    ("route", "body", "status"),
    [
        ("chat/completions", CHAT, 200),
        ("chat/completions", CHAT | {"stream": True}, 200),
        ("completions", COMPLETION, 200),
        ("completions", COMPLETION | {"stream": True}, 200),
        ("chat/completions", CHAT | {"timeout_s": 0}, 400),  # refused by the model
    ],
)
def test_an_ended_request_leaves_no_grpc_call(
    client: TestClient, route: str, body: dict[str, Any], status: int
) -> None:
    gc.collect()
    gc.disable()
    try:
        for _ in range(5):
            reply = client.post(f"/v1/{route}", json=body)
            assert reply.status_code == status, reply.text
            if body.get("stream") and status == 200:
                assert reply.text.rstrip().endswith("data: [DONE]")
        left = live_calls()
    finally:
        gc.enable()
    assert left == 0
