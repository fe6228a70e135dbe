"""The frontend's request ids and trace context: X-Request-Id in and out (errors too), a
bad one refused naming the header, and the traceparent passed on to Triton — the
client's, or with tracing on the frontend's own span under it. No server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from tritonforge.openai import request_context
from tritonforge.openai.request_context import (
    RequestContext,
    RequestContextMiddleware,
    metadata,
    triton_call_settings,
)
from tritonforge.serving.tracing import Tracer, TraceSettings, tracer
from tritonforge.trace.otlp import decode, otlp_json, spans_of

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


async def echo(_request: Request) -> Response:
    """What a route's Triton call would carry."""
    context = request_context.current()
    assert context is not None
    return JSONResponse({"id": context.request_id, "traceparent": context.traceparent})


async def broken(_request: Request) -> Response:
    return JSONResponse({"error": "model is busy"}, status_code=503)


def _app(with_tracer: Tracer | None = None, log_requests: bool = False) -> TestClient:
    routes = [
        Route("/v1/echo", echo, methods=["POST"]),
        Route("/v1/busy", broken),
        Route("/health/ready", broken),
    ]
    app = RequestContextMiddleware(Starlette(routes=routes), with_tracer, log_requests)
    return TestClient(app)


@pytest.fixture
def client() -> Iterator[TestClient]:
    with _app() as test_client:
        yield test_client


def test_the_clients_id_is_the_requests_and_comes_back(client: TestClient) -> None:
    reply = client.post("/v1/echo", headers={"X-Request-Id": "abc-123"})
    assert reply.headers["X-Request-Id"] == "abc-123"
    assert reply.json()["id"] == "abc-123"


def test_a_request_without_an_id_gets_one_and_is_told_it(client: TestClient) -> None:
    reply = client.post("/v1/echo")
    made = reply.headers["X-Request-Id"]
    assert reply.json()["id"] == made and len(made) == 32


def test_an_error_answer_carries_the_id_too(client: TestClient) -> None:
    reply = client.get("/v1/busy", headers={"X-Request-Id": "abc-503"})
    assert reply.status_code == 503 and reply.headers["X-Request-Id"] == "abc-503"


def test_a_bad_id_is_a_400_naming_the_header(client: TestClient) -> None:
    reply = client.post("/v1/echo", headers={"X-Request-Id": "has space"})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "X-Request-Id"
    assert error["message"].startswith("X-Request-Id header: must be visible ASCII")


def test_tracing_off_passes_the_clients_traceparent_on(client: TestClient) -> None:
    reply = client.post("/v1/echo", headers={"traceparent": TRACEPARENT})
    assert reply.json()["traceparent"] == TRACEPARENT


def test_tracing_on_passes_its_own_span_on_under_the_clients(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="tritonforge.openai")
    bodies: list[bytes] = []
    frontend = tracer(TraceSettings("http://unused", 1.0), "test", "t", bodies.append, env={})
    with _app(frontend, log_requests=True) as client:
        reply = client.post(
            "/v1/echo", headers={"traceparent": TRACEPARENT, "X-Request-Id": "abc-t"}
        )
    frontend.shutdown()
    forwarded = reply.json()["traceparent"]
    [span] = [s for body in bodies for s in spans_of(otlp_json(decode(body, "protobuf")))]
    assert span.parent_id == CLIENT_SPAN and span.trace_id == CLIENT_TRACE
    assert forwarded == f"00-{CLIENT_TRACE}-{span.span_id}-01"
    assert span.attributes["tritonforge.request_id"] == "abc-t"
    assert span.attributes["http.response.status_code"] == 200
    assert span.name == "POST /v1/echo" and span.error is None
    assert "request abc-t: POST /v1/echo -> 200 in " in caplog.text
    assert f"(trace {CLIENT_TRACE})" in caplog.text  # the line names the request's trace


def test_a_triton_call_carries_the_id_and_the_trace_context() -> None:
    context = RequestContext("abc-9", TRACEPARENT)
    assert triton_call_settings(context) == {
        "request_id": "abc-9",
        "parameters": {"traceparent": TRACEPARENT},
    }
    assert metadata(context) == {"traceparent": TRACEPARENT}
    assert triton_call_settings(RequestContext("abc-10")) == {"request_id": "abc-10"}
    assert metadata(RequestContext("abc-10")) is None
    assert triton_call_settings(None) == {} and metadata(None) is None


def test_request_lines_are_off_unless_turned_on(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="tritonforge.openai")
    with _app() as quiet:
        quiet.post("/v1/echo", headers={"X-Request-Id": "unlogged"})
    assert "unlogged" not in caplog.text


def test_on_each_api_request_has_one_line_with_its_id_and_status(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="tritonforge.openai")
    with _app(log_requests=True) as logged:
        logged.post("/v1/echo", headers={"X-Request-Id": "logged-1"})
        logged.get("/v1/busy", headers={"X-Request-Id": "logged-2"})
        logged.get("/health/ready", headers={"X-Request-Id": "probe-1"})
    [ok] = [r.getMessage() for r in caplog.records if "logged-1" in r.getMessage()]
    [busy] = [r.getMessage() for r in caplog.records if "logged-2" in r.getMessage()]
    assert ok.startswith("request logged-1: POST /v1/echo -> 200 in ") and "trace" not in ok
    assert "GET /v1/busy -> 503" in busy
    assert "probe-1" not in caplog.text  # health probes are not requests worth a line
