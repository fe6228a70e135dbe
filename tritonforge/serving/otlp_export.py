"""Spans built as OTLP protobuf messages and sent in batches over OTLP/HTTP.

Why not the OpenTelemetry SDK's spans, batch processor and exporter: a traced request's
cost is all per request (a handful of spans, one export's share), and on the unpaced
synthetic engine its 256 tokens leave in one or two responses, so that cost is a visible
share of the request. The SDK builds a span object per span, hands it through its batch
processor, and encodes every batch with its generic encoder on its export thread (holding
the GIL); here spans are made once, as the ``opentelemetry.proto`` ``Span`` messages the
wire carries, queued, and sent by one thread as one ``ExportTraceServiceRequest`` a
batch: the SDK's batching rules (``OTEL_BSP_SCHEDULE_DELAY``,
``OTEL_BSP_MAX_EXPORT_BATCH_SIZE``, ``OTEL_BSP_MAX_QUEUE_SIZE``), the same protocol, about
half the process CPU a traced request (``perf/results/tracing-parts``).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from tritonforge.serving.errors import RequestError

_log = logging.getLogger(__name__)

SERVER = Span.SPAN_KIND_SERVER
INTERNAL = Span.SPAN_KIND_INTERNAL

#: The SDK's batch settings, read under the SDK's names, with the SDK's defaults.
SCHEDULE_DELAY_ENV = "OTEL_BSP_SCHEDULE_DELAY"
MAX_BATCH_ENV = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"
MAX_QUEUE_ENV = "OTEL_BSP_MAX_QUEUE_SIZE"
EXPORT_TIMEOUT_S = 10.0


def set_value(target: AnyValue, value: Any) -> None:
    """A span attribute's value as OTLP carries it (a sequence: an array of its items)."""
    if isinstance(value, str):
        target.string_value = value
    elif isinstance(value, bool):
        target.bool_value = value
    elif isinstance(value, int):
        target.int_value = value
    elif isinstance(value, float):
        target.double_value = value
    elif isinstance(value, (tuple, list)):
        items = target.array_value.values
        for item in value:
            set_value(items.add(), item)
    else:
        target.string_value = str(value)


def add_attributes(target: Any, attributes: Mapping[str, Any]) -> None:
    """Append ``attributes`` to a repeated ``KeyValue`` field: filled in place, which
    takes a third of the time building each ``KeyValue`` and copying it in does."""
    add = target.add
    for key, value in attributes.items():
        set_value(add(key=key).value, value)


def span(
    name: str,
    trace_id: bytes,
    span_id: int,
    parent_id: int | None,
    start_ns: int,
    end_ns: int,
    attributes: Mapping[str, Any] | None = None,
    kind: Span.SpanKind.ValueType = INTERNAL,
    error: str | None = None,
) -> Span:
    """One finished span (``error``: its status is ERROR with this message)."""
    message = Span(
        trace_id=trace_id,
        span_id=span_id.to_bytes(8, "big"),
        name=name,
        kind=kind,
        start_time_unix_nano=start_ns,
        end_time_unix_nano=max(end_ns, start_ns),
    )
    if attributes:
        add_attributes(message.attributes, attributes)
    if parent_id is not None:
        message.parent_span_id = parent_id.to_bytes(8, "big")
    if error is not None:
        message.status.CopyFrom(Status(code=Status.STATUS_CODE_ERROR, message=error))
    return message


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise RequestError(name, f"must be a positive integer, got {raw!r}") from None
    if value <= 0:
        raise RequestError(name, f"must be a positive integer, got {value}")
    return value


class HttpSender:
    """POSTs an encoded export request to an OTLP/HTTP traces URL, one kept connection."""

    def __init__(self, endpoint: str) -> None:
        import requests  # only a process that traces needs it

        self.endpoint = endpoint
        self.session = requests.Session()
        self.session.headers["Content-Type"] = "application/x-protobuf"

    def __call__(self, body: bytes) -> None:
        reply = self.session.post(self.endpoint, data=body, timeout=EXPORT_TIMEOUT_S)
        if reply.status_code >= 300:
            raise RuntimeError(f"HTTP {reply.status_code}: {reply.text[:200]}")

    def close(self) -> None:
        self.session.close()


class SpanBatches:
    """Spans queued by request threads, sent by one thread in batches.

    A batch leaves when ``max_batch`` spans are queued or ``schedule_delay_s`` after the
    last one left; a full queue drops new spans (counted in :attr:`dropped`) rather than
    hold a request. ``send`` takes one encoded ``ExportTraceServiceRequest`` (tests keep
    them); its failures are logged and the batch is dropped, never retried into a queue
    that the next requests fill.
    """

    def __init__(
        self,
        service: str,
        scope: str,
        send: Callable[[bytes], None],
        schedule_delay_s: float = 5.0,
        max_batch: int = 512,
        max_queue: int = 2048,
    ) -> None:
        if max_batch > max_queue:
            raise RequestError(MAX_BATCH_ENV, f"must be at most {MAX_QUEUE_ENV} ({max_queue})")
        self._resource = Resource()
        add_attributes(self._resource.attributes, {"service.name": service})
        self._scope = InstrumentationScope(name=scope)
        self._send = send
        self._delay_s = schedule_delay_s
        self._max_batch = max_batch
        self._max_queue = max_queue
        self._queue: collections.deque[Span] = collections.deque()
        self._wake = threading.Event()
        self._export_lock = threading.Lock()
        self._closed = False
        self.dropped = 0
        self.sent = 0
        self._thread = threading.Thread(target=self._run, name="tritonforge-otlp", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(
        cls, service: str, scope: str, send: Callable[[bytes], None], env: Mapping[str, str]
    ) -> SpanBatches:
        """Batching as the SDK's ``OTEL_BSP_*`` variables set it (a bad value names it)."""
        return cls(
            service,
            scope,
            send,
            _positive_int(env, SCHEDULE_DELAY_ENV, 5000) / 1000,
            _positive_int(env, MAX_BATCH_ENV, 512),
            _positive_int(env, MAX_QUEUE_ENV, 2048),
        )

    def add(self, spans: Sequence[Span]) -> None:
        """Queue one request's spans (called on the request's own thread)."""
        if self._closed or len(self._queue) + len(spans) > self._max_queue:
            self.dropped += len(spans)
            return
        self._queue.extend(spans)
        if len(self._queue) >= self._max_batch:
            self._wake.set()

    def encode(self, spans: Iterable[Span]) -> bytes:
        """One export request of ``spans``, serialized."""
        request = ExportTraceServiceRequest(
            resource_spans=[
                ResourceSpans(
                    resource=self._resource,
                    scope_spans=[ScopeSpans(scope=self._scope, spans=spans)],
                )
            ]
        )
        return request.SerializeToString()

    def flush(self) -> None:
        """Send everything queued now (the caller waits)."""
        with self._export_lock:
            queue = self._queue
            while queue:
                batch = [queue.popleft() for _ in range(min(self._max_batch, len(queue)))]
                try:
                    self._send(self.encode(batch))
                    self.sent += len(batch)
                except Exception as error:  # a collector away must not stop the next batches
                    self.dropped += len(batch)
                    _log.warning("OTLP export of %d spans failed: %s", len(batch), error)

    def shutdown(self) -> None:
        """Send what is left and stop the thread."""
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=EXPORT_TIMEOUT_S * 3)
        self.flush()
        close = getattr(self._send, "close", None)
        if close is not None:
            close()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self._delay_s)
            self._wake.clear()
            self.flush()
