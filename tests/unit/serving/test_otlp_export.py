"""Spans as OTLP protobuf messages in batches: what a collector receives, when a batch
leaves, what a full queue or a failed send does, and bad batch settings named."""

from __future__ import annotations

import threading

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tritonforge.serving.errors import RequestError
from tritonforge.serving.otlp_export import SERVER, SpanBatches, span
from tritonforge.trace.otlp import decode, otlp_json, spans_of

TRACE = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")


def a_span(index: int = 1, error: str | None = None) -> object:
    return span(
        "tritonforge.request",
        TRACE,
        index,
        0xB7AD6B7169203331,
        1_000,
        2_000,
        {"n": 3, "ok": True, "x": 0.5, "s": "v", "reasons": ("stop", "length")},
        SERVER,
        error,
    )


class Sent:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.arrived = threading.Event()

    def __call__(self, body: bytes) -> None:
        self.bodies.append(body)
        self.arrived.set()


def test_a_batch_is_one_export_request_the_receiver_reads() -> None:
    sent = Sent()
    batches = SpanBatches("svc", "scope", sent, schedule_delay_s=60)
    batches.add([a_span(1), a_span(2, error="boom")])  # type: ignore[list-item]
    batches.shutdown()
    [body] = sent.bodies
    request = ExportTraceServiceRequest.FromString(body)
    assert request.resource_spans[0].scope_spans[0].scope.name == "scope"
    first, second = spans_of(otlp_json(decode(body, "application/x-protobuf")))
    assert first.service == "svc" and first.trace_id == TRACE.hex()
    assert first.span_id == f"{1:016x}" and first.parent_id == "b7ad6b7169203331"
    assert (first.start_ns, first.end_ns, first.error) == (1_000, 2_000, None)
    assert first.attributes == {
        "n": 3,
        "ok": True,
        "x": 0.5,
        "s": "v",
        "reasons": ["stop", "length"],
    }
    assert second.error == "boom"


def test_a_full_batch_leaves_before_the_schedule() -> None:
    sent = Sent()
    batches = SpanBatches("svc", "scope", sent, schedule_delay_s=60, max_batch=4, max_queue=8)
    try:
        batches.add([a_span(i) for i in range(4)])  # type: ignore[misc]
        assert sent.arrived.wait(10)
    finally:
        batches.shutdown()
    assert batches.sent == 4


def test_a_full_queue_drops_new_spans_and_a_failed_send_its_batch() -> None:
    def refuse(body: bytes) -> None:
        raise ConnectionError("collector away")

    batches = SpanBatches("svc", "scope", refuse, schedule_delay_s=60, max_batch=2, max_queue=2)
    batches._wake.set = lambda: None  # type: ignore[method-assign]  # keep the queue full
    batches.add([a_span(1), a_span(2)])  # type: ignore[list-item]
    batches.add([a_span(3)])  # type: ignore[list-item]
    assert batches.dropped == 1
    del batches._wake.set  # type: ignore[method-assign]
    batches.shutdown()
    assert batches.dropped == 3 and batches.sent == 0


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({"OTEL_BSP_SCHEDULE_DELAY": "soon"}, "OTEL_BSP_SCHEDULE_DELAY"),
        ({"OTEL_BSP_MAX_QUEUE_SIZE": "0"}, "OTEL_BSP_MAX_QUEUE_SIZE"),
        ({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "4096"}, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"),
    ],
)
def test_a_bad_batch_setting_names_its_variable(env: dict[str, str], name: str) -> None:
    with pytest.raises(RequestError) as refused:
        SpanBatches.from_env("svc", "scope", Sent(), env)
    assert refused.value.field == name
