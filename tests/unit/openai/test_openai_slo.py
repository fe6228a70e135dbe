"""SLOs and priority through the OpenAI frontend, without a server: body keys and the
``x-slo-*`` headers reach the model's sampling keys; a refusal by the model's SLO
admission is a 429 with ``Retry-After``."""

from __future__ import annotations

from tests.unit.openai.test_openai_translate import USER, FakeGateway, chat, client
from tritonforge.openai.errors import from_triton

REFUSAL = (
    "SLO admission refused the request: predicted TTFT 2450 ms exceeds slo_ttft_ms 500 ms; "
    "retry after 2 s or on another replica"
)


def test_body_keys_pass_through_as_sampling_keys() -> None:
    request = chat(slo_ttft_ms=500, slo_tpot_ms=80, priority=-2)
    wanted = {"slo_ttft_ms": 500, "slo_tpot_ms": 80, "priority": -2}
    assert {key: request.sampling.get(key) for key in wanted} == wanted


def test_headers_fill_in_slos_the_body_left_out() -> None:
    gateway = FakeGateway([], [])
    app = client(gateway)
    body = {"model": "llm", "messages": USER, "max_tokens": 1}
    app.post("/v1/chat/completions", json=body, headers={"x-slo-ttft-ms": " 250 "})
    app.post(
        "/v1/chat/completions",
        json={**body, "slo_ttft_ms": 900},
        headers={"x-slo-ttft-ms": "250", "x-slo-tpot-ms": "40"},
    )
    first, second = gateway.sent  # the sampling keys each request carried
    assert first["slo_ttft_ms"] == "250" and "slo_tpot_ms" not in first
    assert second["slo_ttft_ms"] == 900 and second["slo_tpot_ms"] == "40"  # the body wins


def test_an_slo_refusal_is_a_429_with_retry_after_naming_the_prediction() -> None:
    error = from_triton(REFUSAL, "llm")
    assert (error.status, error.code, error.retry_after_s) == (429, "slo_unattainable", 2)
    gateway = FakeGateway([from_triton(REFUSAL, "llm")])
    reply = client(gateway).post(
        "/v1/chat/completions", json={"model": "llm", "messages": USER, "slo_ttft_ms": 500}
    )
    assert reply.status_code == 429
    assert reply.headers["Retry-After"] == "2"
    assert "predicted TTFT 2450 ms exceeds slo_ttft_ms 500 ms" in reply.json()["error"]["message"]
