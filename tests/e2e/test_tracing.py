"""Tracing end to end: one request id and one trace from the client to the engine.

A real OTLP/HTTP receiver (:mod:`tritonforge.trace.receiver`: an HTTP server decoding
``ExportTraceServiceRequest`` with opentelemetry-proto) takes the spans of a tritonserver
of this module's own — ``synthetic_model`` and ``guarded_chat`` guarding it, ready in
seconds — with Triton's own OpenTelemetry trace on, and of the OpenAI frontend in front
of it, both with tracing configured as a user would (the environment, and Triton's
``--trace-config``).
The session's server is left alone: its tracing is off.
"""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import tritonclient.grpc as grpcclient

from tests.e2e.client import llm_inputs, wait_for
from tritonforge.launch.launcher import MODEL_REPOSITORY, OpenAIFrontend, TritonServer
from tritonforge.serving.request_log import LOG_REQUESTS_ENV
from tritonforge.serving.tracing import ENDPOINT_ENV
from tritonforge.trace.otlp import SpanRecord
from tritonforge.trace.receiver import Receiver

MODEL = "synthetic_model"
GUARDED = "guarded_chat"
#: A prompt no span and no log line may contain.
PROMPT = "canary-5b1f0c tell me about the moons of Jupiter"
CLIENT_SPAN = "b7ad6b7169203331"
FRONTEND = "tritonforge-openai"
RUNTIME = "tritonforge-runtime"
TRITON = "triton-inference-server"


def triton_trace_args(url: str) -> list[str]:
    """Triton's own OpenTelemetry trace of every request, exported to ``url`` quickly."""
    return [
        "--trace-config=mode=opentelemetry",
        "--trace-config=rate=1",
        "--trace-config=level=TIMESTAMPS",
        f"--trace-config=opentelemetry,url={url}",
        "--trace-config=opentelemetry,bsp_schedule_delay=100",
    ]


def repository(root: Path) -> Path:
    """``synthetic_model``, and ``guarded_chat`` guarding it (instead of vllm_model)."""
    root.mkdir()
    (root / MODEL).symlink_to(MODEL_REPOSITORY / MODEL)
    shutil.copytree(MODEL_REPOSITORY / GUARDED, root / GUARDED)
    config = root / GUARDED / "config.pbtxt"
    text = config.read_text()
    inner = 'key: "llm_model" value: { string_value: "vllm_model" }'
    assert inner in text, "guarded_chat's inner model is set elsewhere now"
    config.write_text(text.replace(inner, inner.replace("vllm_model", MODEL)))
    return root


@dataclass(frozen=True)
class Traced:
    """The frontend in front of a traced server of this module's own, the receiver of
    their spans, and the server's log."""

    frontend: OpenAIFrontend
    receiver: Receiver
    server_log: Path
    grpc_url: str


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traced]:
    where = tmp_path_factory.mktemp("tracing")
    receiver = Receiver(where / "spans.jsonl")
    server = TritonServer.on_free_ports(
        repository=repository(where / "repository"),
        models=[MODEL, GUARDED],
        extra_args=triton_trace_args(receiver.url),
        log_path=where / "triton.log",
    )
    frontend = OpenAIFrontend.on_free_port(server.grpc_url, log_path=where / "openai.log")
    with pytest.MonkeyPatch.context() as patch:  # read by both processes as they start
        patch.setenv(ENDPOINT_ENV, receiver.url)
        patch.setenv(LOG_REQUESTS_ENV, "1")  # the request lines the logs test reads
        patch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        server.start()
        frontend.start()
    try:
        server.wait_ready(120)
        frontend.wait_ready()
        yield Traced(frontend, receiver, where / "triton.log", server.grpc_url)
    finally:
        frontend.stop()
        server.stop()
        receiver.close()


def unlinked(spans: list[SpanRecord]) -> list[str]:
    """The spans whose chain of parents does not reach the client's span."""
    by_id = {span.span_id: span for span in spans}
    lost = []
    for span in spans:
        seen = span
        while seen.parent_id != CLIENT_SPAN and seen.parent_id in by_id:
            seen = by_id[seen.parent_id]
        if seen.parent_id != CLIENT_SPAN:
            lost.append(f"{span.name} ({span.service})")
    return lost


def lost_by_triton(receiver: Receiver, known: set[str], model: str) -> bool:
    """Whether Triton started a trace of its own for a request since ``known`` (the span
    ids received before it): a new ``InferRequest`` with no parent, whose trace has
    Triton's span of ``model``. Triton 2.51 loses a gRPC call's ``traceparent`` now and
    then (W18 in docs/triton-2.51-workarounds.md); its own spans are then not in the
    client's trace, and only ours must be."""
    with receiver.lock:
        spans = list(receiver.spans)
    orphans = {
        span.trace_id
        for span in spans
        if span.service == TRITON
        and span.name == "InferRequest"
        and not span.parent_id
        and span.span_id not in known
    }
    return any(span.trace_id in orphans and span.name == model for span in spans)


def received(receiver: Receiver) -> set[str]:
    with receiver.lock:
        return {span.span_id for span in receiver.spans}


def chat(
    frontend: OpenAIFrontend, headers: dict[str, str], max_tokens: int, **extra: object
) -> requests.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "stream": True,
        "max_tokens": max_tokens,
        **extra,
    }
    return requests.post(
        f"{frontend.base_url}/chat/completions", json=body, headers=headers, stream=True, timeout=60
    )


def test_a_streamed_chat_is_one_trace_under_the_clients_span_with_one_request_id(
    traced: Traced,
) -> None:
    frontend, receiver = traced.frontend, traced.receiver
    trace_id = uuid.uuid4().hex
    request_id = f"tracing-e2e-{uuid.uuid4().hex[:12]}"
    headers = {"X-Request-Id": request_id, "traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01"}
    known = received(receiver)
    with chat(frontend, headers, 8) as reply:
        assert reply.status_code == 200, reply.text
        assert reply.headers["X-Request-Id"] == request_id
        events = reply.text
    assert events.rstrip().endswith("data: [DONE]")

    def complete() -> bool:
        """Each layer's spans arrived (they leave in batches), every one linked."""
        spans = receiver.trace(trace_id)
        names = {(span.service, span.name) for span in spans}
        return (
            {(RUNTIME, "tritonforge.request"), (RUNTIME, "tritonforge.response.final")} <= names
            and any(service == FRONTEND for service, _ in names)
            and (
                any(service == TRITON for service, _ in names)
                or lost_by_triton(receiver, known, MODEL)
            )
            and not unlinked(spans)
        )

    wait_for(complete, 30, "the frontend's, Triton's and the runtime's spans, linked")
    spans = receiver.trace(trace_id)
    assert not unlinked(spans)  # every span hangs, through its parents, under the client's
    by_id = {span.span_id: span for span in spans}
    [http] = [span for span in spans if span.service == FRONTEND]
    assert http.parent_id == CLIENT_SPAN
    [root] = [span for span in spans if span.name == "tritonforge.request"]
    if any(span.service == TRITON for span in spans):
        assert by_id[root.parent_id].service == TRITON, "the runtime's spans are not under Triton's"
    else:  # Triton lost the frontend's context (W18): the runtime's parent is the frontend's
        assert root.parent_id == http.span_id
    for span in (http, root):
        assert span.attributes["tritonforge.request_id"] == request_id
    assert root.attributes["gen_ai.request.model"] == MODEL
    assert root.attributes["gen_ai.usage.output_tokens"] > 0
    assert root.attributes["gen_ai.response.finish_reasons"]
    runtime_names = {span.name for span in spans if span.parent_id == root.span_id}
    assert {"tritonforge.queue", "tritonforge.prefill", "tritonforge.sends"} <= runtime_names
    assert "tritonforge.response.final" in runtime_names
    assert PROMPT not in json.dumps([span.attributes for span in spans])

    assert frontend.log_path is not None
    frontend_log = frontend.log_path.read_text(errors="replace")
    assert request_id in frontend_log
    wait_for(
        lambda: f"request {request_id}: finished" in traced.server_log.read_text(errors="replace"),
        10,
        "the runtime's line",
    )
    assert PROMPT not in frontend_log
    assert PROMPT not in traced.server_log.read_text(errors="replace")

    timeline = subprocess.run(
        [sys.executable, "-m", "tritonforge.trace", str(receiver.file), "--request-id", request_id],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for name in ("POST /v1/chat/completions", "tritonforge.prefill", "tritonforge.decode"):
        assert name in timeline


def test_a_duplicate_id_is_refused_naming_it_and_a_cancel_ends_its_trace_in_error(
    traced: Traced,
) -> None:
    frontend, receiver = traced.frontend, traced.receiver
    request_id = f"tracing-dup-{uuid.uuid4().hex[:12]}"
    first_trace, second_trace = uuid.uuid4().hex, uuid.uuid4().hex
    first_headers = {
        "X-Request-Id": request_id,
        "traceparent": f"00-{first_trace}-{CLIENT_SPAN}-01",
    }
    # 1,900 tokens at this server's simulated 10 ms a step: 19 s, cancelled by the block's end.
    with chat(frontend, first_headers, 1900, ignore_eos=True) as first:
        assert first.status_code == 200, first.text
        lines = first.iter_lines()
        assert next(line for line in lines if line.startswith(b"data:"))  # it is in flight
        second = requests.post(
            f"{frontend.base_url}/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
            headers={
                "X-Request-Id": request_id,
                "traceparent": f"00-{second_trace}-{CLIENT_SPAN}-01",
            },
            timeout=60,
        )
    assert second.status_code == 400, second.text
    assert second.headers["X-Request-Id"] == request_id
    error = second.json()["error"]
    assert "already in flight" in error["message"] and request_id in error["message"]
    assert error["param"] == "X-Request-Id"

    def runtime_root(trace_id: str) -> SpanRecord | None:
        roots = [s for s in receiver.trace(trace_id) if s.name == "tritonforge.request"]
        return roots[0] if roots else None

    wait_for(lambda: runtime_root(second_trace) is not None, 30, "the refused request's span")
    wait_for(lambda: runtime_root(first_trace) is not None, 30, "the cancelled request's span")
    refused, cancelled = runtime_root(second_trace), runtime_root(first_trace)
    assert refused is not None and refused.attributes["tritonforge.outcome"] == "refused"
    assert refused.error is not None and "already in flight" in refused.error
    assert cancelled is not None and cancelled.attributes["tritonforge.outcome"] == "cancelled"
    assert cancelled.error == "cancelled by the client"


def grpc_stream(url: str, model: str, request_id: str, traceparent: str, streamed: bool) -> None:
    """One streamed request over Triton's gRPC API, its id and trace context as a
    tritonclient user sends them (``request_id=``, the ``traceparent`` metadata)."""
    events: queue.Queue[tuple[object, object]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(
        callback=lambda result, error: events.put((result, error)),
        headers={"traceparent": traceparent},
    )
    try:
        inputs = llm_inputs(PROMPT, {"max_tokens": 8}, stream=streamed)
        client.async_stream_infer(
            model, inputs, request_id=request_id, enable_empty_final_response=True
        )
        while True:
            result, error = events.get(timeout=60)
            assert error is None, error
            parameters = result.get_response().parameters  # type: ignore[attr-defined]
            if parameters["triton_final_response"].bool_param:
                return
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize(("model", "streamed"), [(MODEL, True), (GUARDED, True), (GUARDED, False)])
def test_a_triton_grpc_stream_is_one_trace_down_to_the_runtime(
    traced: Traced, model: str, streamed: bool
) -> None:
    """Straight to the model, and through guarded_chat's inner gRPC stream to it (streamed
    or not: either way the inner call runs on a thread after ``execute`` returned)."""
    receiver = traced.receiver
    trace_id = uuid.uuid4().hex
    request_id = f"tracing-grpc-{uuid.uuid4().hex[:12]}"
    known = received(receiver)
    grpc_stream(traced.grpc_url, model, request_id, f"00-{trace_id}-{CLIENT_SPAN}-01", streamed)

    def complete() -> bool:
        spans = receiver.trace(trace_id)
        names = {span.name for span in spans}
        return (
            {"tritonforge.request", "tritonforge.response.final"} <= names
            and (model in names or lost_by_triton(receiver, known, model))
            and not unlinked(spans)
        )

    wait_for(complete, 30, f"Triton's (or its own trace's) and the runtime's spans of {model}")
    spans = receiver.trace(trace_id)
    [root] = [span for span in spans if span.name == "tritonforge.request"]
    runtime_id = root.attributes["tritonforge.request_id"]
    if model == MODEL:
        assert runtime_id == request_id
    else:  # the inner request's id names the client's (and is its own)
        assert runtime_id.startswith(f"{request_id}/guarded_chat-")
    assert PROMPT not in json.dumps([span.attributes for span in spans])
