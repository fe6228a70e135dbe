"""OpenTelemetry traces of requests: off unless an OTLP endpoint is configured.

Turned on per process by the environment (``TRITONFORGE_OTLP_ENDPOINT``, else the SDK's
own ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``; ``TRITONFORGE_TRACE_SAMPLING`` the ratio of
requests without a sampled parent to trace), so the launcher, the server's stubs and the
OpenAI frontend all follow one setting. Off, nothing here is built: the runtime holds no
tracer, a request no trace, and its per-token path is what it was.

On, a request's spans are built when it ends, from times the runtime records anyway
(:class:`~tritonforge.serving.runtime` keeps submit, start, first and last token for
its metrics); only its sends are timed on the way, by a channel wrapped around the
request's own (:class:`TracedChannel`). The spans, under one ``tritonforge.request``
span whose parent is the caller's W3C ``traceparent`` (Triton's own span of the
request when Triton traces, else the client's):

- ``tritonforge.admission``: the admission decision and its TTFT prediction;
- ``tritonforge.queue``: from submit until the engine's loop took the request;
- ``tritonforge.prefill``: from there to the first token (the engine's own queue and
  the prompt's evaluation: the engine does not say where one ends);
- ``tritonforge.decode``: first token to last;
- ``tritonforge.sends``: the streamed responses (how many, time spent sending);
- ``tritonforge.response.final``: the FINAL response going out.

Attributes follow OpenTelemetry's gen_ai conventions (model, token usage, time to
first token, finish reasons) plus the request id. No prompt or output text is ever
put on a span.
"""

from __future__ import annotations

import contextvars
import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    get_current_span,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tritonforge.serving.admission import SloUnattainable
from tritonforge.serving.errors import RequestError

if TYPE_CHECKING:
    import numpy.typing as npt

    from tritonforge.engines.base import EngineOutput
    from tritonforge.serving.runtime import Channel, Logger
    from tritonforge.serving.schema import GenerateRequest

#: The W3C header (and Triton request parameter) that carries a trace's context.
TRACEPARENT = "traceparent"
ENDPOINT_ENV = "TRITONFORGE_OTLP_ENDPOINT"
OTEL_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
SAMPLING_ENV = "TRITONFORGE_TRACE_SAMPLING"

_PROPAGATOR = TraceContextTextMapPropagator()

#: The root span of the traced request an engine call serves (its task's context).
_ENGINE_TRACE: contextvars.ContextVar[SpanContext | None] = contextvars.ContextVar(
    "tritonforge_engine_trace", default=None
)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_UNSET = Status(StatusCode.UNSET)


def engine_trace_headers() -> dict[str, str] | None:
    """W3C headers for an engine that traces requests itself (vLLM's request span), so
    its span joins the request's trace under ``tritonforge.request``; None when the
    request being served is not traced."""
    root = _ENGINE_TRACE.get()
    return None if root is None else {TRACEPARENT: traceparent_of(NonRecordingSpan(root))}


@dataclass(frozen=True)
class TraceSettings:
    """Where spans go (an OTLP/HTTP traces URL) and which share of requests is traced."""

    endpoint: str | None = None
    sampling: float = 1.0

    @property
    def enabled(self) -> bool:
        return bool(self.endpoint) and self.sampling > 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TraceSettings:
        """The settings the environment gives; a bad value names its variable."""
        env = os.environ if env is None else env
        endpoint = env.get(ENDPOINT_ENV, "").strip() or env.get(OTEL_ENDPOINT_ENV, "").strip()
        return cls(endpoint or None, parse_sampling(env.get(SAMPLING_ENV, ""), SAMPLING_ENV))


def parse_sampling(raw: str, field: str) -> float:
    """A sampling ratio in [0, 1] (empty: 1, every request)."""
    if not raw.strip():
        return 1.0
    try:
        ratio = float(raw)
    except ValueError:
        raise RequestError(field, f"must be a number in [0, 1], got {raw!r}") from None
    if not 0.0 <= ratio <= 1.0:
        raise RequestError(field, f"must be in [0, 1], got {ratio:g}")
    return ratio


def tracer_provider(
    settings: TraceSettings, service: str, exporter: SpanExporter | None = None
) -> TracerProvider:
    """A provider of this process's own (never the global one: an engine may set that).

    Spans leave in batches on the SDK's exporter thread, so a request never waits for
    the collector. ``exporter`` replaces the OTLP/HTTP one (tests keep spans in memory).
    """
    return span_pipeline(settings, service, exporter)[0]


def span_pipeline(
    settings: TraceSettings, service: str, exporter: SpanExporter | None = None
) -> tuple[TracerProvider, BatchSpanProcessor]:
    """:func:`tracer_provider` and the batch processor it exports through (the runtime
    hands its finished spans straight to it)."""
    sampler = ParentBased(TraceIdRatioBased(settings.sampling))
    provider = TracerProvider(resource=Resource({"service.name": service}), sampler=sampler)
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=settings.endpoint)
    processor = BatchSpanProcessor(exporter)
    provider.add_span_processor(processor)
    return provider, processor


def parent_context(traceparent: str | None) -> Context | None:
    """The context a ``traceparent`` value names (None: absent or malformed)."""
    if not traceparent:
        return None
    context = _PROPAGATOR.extract({TRACEPARENT: traceparent})
    return context if context else None


def traceparent_of(span: Span) -> str:
    """The ``traceparent`` that makes ``span`` the parent of the next hop's spans."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, set_span_in_context(span))
    return carrier.get(TRACEPARENT, "")


class _Clock:
    """``time.perf_counter()`` seconds as epoch nanoseconds (what spans are stamped in)."""

    __slots__ = ("offset_ns",)

    def __init__(self) -> None:
        self.offset_ns = time.time_ns() - time.perf_counter_ns()

    def ns(self, perf_s: float) -> int:
        return int(perf_s * 1e9) + self.offset_ns


class RuntimeTracer:
    """Starts one :class:`RequestTrace` per sampled request of one model.

    A request's spans are not the SDK's live ``Span`` objects: each is built once, when
    the request has ended, as the finished ``ReadableSpan`` it would have become, and
    handed to the batch processor — the same spans, exported the same way, without the
    live spans' locks, attribute checks and one sampling call per span (the provider's
    sampler decides once, for the request's root).
    """

    def __init__(
        self, provider: TracerProvider, processor: SpanProcessor, model: str, logger: Logger
    ) -> None:
        self.provider = provider
        self.processor = processor
        self.model = model
        self.logger = logger
        self.scope = InstrumentationScope("tritonforge.serving")

    def begin(
        self, request_id: str, request: GenerateRequest, traceparent: str | None
    ) -> RequestTrace | None:
        """The request's trace, or None if it is not sampled (then nothing more is done)."""
        context = parent_context(traceparent)
        parent = get_current_span(context).get_span_context() if context is not None else None
        if parent is not None and not parent.is_valid:
            parent = None
        ids = self.provider.id_generator
        trace_id = parent.trace_id if parent is not None else ids.generate_trace_id()
        sampled = self.provider.sampler.should_sample(
            context, trace_id, "tritonforge.request", SpanKind.SERVER
        )
        if sampled.decision is not Decision.RECORD_AND_SAMPLE:
            return None
        root = SpanContext(trace_id, ids.generate_span_id(), False, _SAMPLED, sampled.trace_state)
        attributes: dict[str, Any] = {
            "tritonforge.request_id": request_id,
            "gen_ai.operation.name": "chat" if request.messages is not None else "text_completion",
            "gen_ai.request.model": self.model,
            "gen_ai.request.max_tokens": request.sampling.max_tokens,
            "tritonforge.stream": request.stream,
        }
        return RequestTrace(self, root, parent, attributes, request_id)

    def shutdown(self) -> None:
        """Export what is left (a model unloading): spans of its last requests too."""
        self.provider.shutdown()


class RequestTrace:
    """One traced request: its root span's identity, and the times its spans are built from.

    Sends are timed on response threads, the rest on the engine's loop; the spans are
    built once, by :meth:`end`, after the FINAL response went out.
    """

    def __init__(
        self,
        tracer: RuntimeTracer,
        root: SpanContext,
        parent: SpanContext | None,
        attributes: dict[str, Any],
        request_id: str,
    ) -> None:
        self.tracer = tracer
        self.root = root
        self.parent = parent
        self.attributes = attributes
        self.request_id = request_id
        self.clock = _Clock()
        self.submitted = time.perf_counter()
        self.sends = 0
        self.send_busy_s = 0.0
        self.first_send: float | None = None
        self.last_send_end: float | None = None
        self.final_send: tuple[float, float] | None = None
        self._lock = threading.Lock()
        self._ended = False

    def enter_engine(self) -> None:
        """Make the request's root span the parent of the engine's own spans: called in
        the task that runs the request's engine call (:func:`engine_trace_headers`)."""
        _ENGINE_TRACE.set(self.root)

    def channel(self, inner: Channel) -> TracedChannel:
        """``inner`` with every send timed for this trace."""
        return TracedChannel(inner, self)

    def _emit(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, Any] | None,
        kind: SpanKind = SpanKind.INTERNAL,
        status: Status | None = None,
    ) -> None:
        tracer = self.tracer
        span = ReadableSpan(
            name,
            context,
            parent,
            tracer.provider.resource,
            attributes or {},
            kind=kind,
            status=status or _UNSET,
            start_time=start_ns,
            end_time=max(end_ns, start_ns),
            instrumentation_scope=tracer.scope,
        )
        tracer.processor.on_end(span)

    def _span(
        self,
        name: str,
        start: float,
        end: float,
        attributes: Mapping[str, Any] | None = None,
        status: Status | None = None,
    ) -> None:
        """A finished child of the request's root span."""
        root = self.root
        context = SpanContext(
            root.trace_id,
            self.tracer.provider.id_generator.generate_span_id(),
            False,
            root.trace_flags,
            root.trace_state,
        )
        clock = self.clock
        self._emit(name, context, root, clock.ns(start), clock.ns(end), attributes, status=status)

    def admitted(
        self, decision: str, predicted_ttft_s: float | None, started: float, ended: float
    ) -> None:
        """The admission span of a request admission let in (``decision``: its counter's label)."""
        attributes: dict[str, Any] = {"tritonforge.admission.decision": decision}
        if predicted_ttft_s is not None:
            attributes["tritonforge.admission.predicted_ttft_ms"] = predicted_ttft_s * 1000
        self._span("tritonforge.admission", started, ended, attributes)

    def refused(self, error: BaseException) -> None:
        """The request never reached the engine (admission, a full model, a bad id…)."""
        now = time.perf_counter()
        if isinstance(error, SloUnattainable):
            self._span(
                "tritonforge.admission",
                self.submitted,
                now,
                {"tritonforge.admission.decision": "refused"},
                Status(StatusCode.ERROR, str(error)),
            )
        self._finish("refused", error, now)

    def sent(self, started: float, ended: float, final: bool) -> None:
        """One response went out (a response thread)."""
        if final:
            self.final_send = (started, ended)
            return
        if self.first_send is None:
            self.first_send = started
        self.sends += 1
        self.send_busy_s += ended - started
        self.last_send_end = ended

    def end(
        self,
        started: float | None,
        first_token_at: float | None,
        last_token_at: float | None,
        prompt_tokens: int | None,
        output_tokens: int,
        output: EngineOutput | None,
        error: BaseException | None,
        outcome: str,
    ) -> None:
        """Build the request's spans and end its root (after its FINAL response went out).

        ``started``: when the engine's loop took it; token times as the metrics saw them.
        """
        root = self.attributes
        if started is not None:
            self._span("tritonforge.queue", self.submitted, started)
            if first_token_at is not None:
                self._span(
                    "tritonforge.prefill",
                    started,
                    first_token_at,
                    {"gen_ai.usage.input_tokens": prompt_tokens or 0},
                )
                root["gen_ai.server.time_to_first_token"] = first_token_at - started
                if last_token_at is not None:
                    self._span(
                        "tritonforge.decode",
                        first_token_at,
                        last_token_at,
                        {"gen_ai.usage.output_tokens": output_tokens},
                    )
        if self.first_send is not None and self.last_send_end is not None:
            self._span(
                "tritonforge.sends",
                self.first_send,
                self.last_send_end,
                {
                    "tritonforge.sends.count": self.sends,
                    "tritonforge.sends.busy_ms": self.send_busy_s * 1000,
                },
            )
        if self.final_send is not None:
            self._span("tritonforge.response.final", *self.final_send)
        if prompt_tokens is not None:
            root["gen_ai.usage.input_tokens"] = prompt_tokens
        root["gen_ai.usage.output_tokens"] = output_tokens
        reasons = finish_reasons(output)
        if reasons:
            root["gen_ai.response.finish_reasons"] = tuple(reasons)
        ended = self.final_send[1] if self.final_send is not None else time.perf_counter()
        self._finish(outcome, error, ended, prompt_tokens, output_tokens, first_token_at, started)

    def _finish(
        self,
        outcome: str,
        error: BaseException | None,
        ended: float,
        prompt_tokens: int | None = None,
        output_tokens: int = 0,
        first_token_at: float | None = None,
        started: float | None = None,
    ) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self.attributes["tritonforge.outcome"] = outcome
        status = None
        if error is not None:
            why = "cancelled by the client" if outcome == "cancelled" else str(error)
            status = Status(StatusCode.ERROR, why or type(error).__name__)
        self._emit(
            "tritonforge.request",
            self.root,
            self.parent,
            self.clock.ns(self.submitted),
            self.clock.ns(ended),
            self.attributes,
            SpanKind.SERVER,
            status,
        )
        ttft = ""
        if first_token_at is not None and started is not None:
            ttft = f", first token after {(first_token_at - self.submitted) * 1000:.0f} ms"
        tokens = f", {prompt_tokens} prompt + {output_tokens} output tokens"
        self.tracer.logger.log_info(
            f"[tritonforge] request {self.request_id}: {outcome}"
            f"{tokens if prompt_tokens is not None else ''}{ttft}, "
            f"{(ended - self.submitted) * 1000:.0f} ms "
            f"(trace {self.root.trace_id:032x})"
        )


def finish_reasons(output: EngineOutput | None) -> list[str]:
    """The finish reasons an output carries: its own, or each sequence's (n > 1)."""
    if output is None:
        return []
    if output.choices:
        return [choice.finish_reason for choice in output.choices if choice.finish_reason]
    return [output.finish_reason] if output.finish_reason else []


class TracedChannel:
    """A request's :class:`~tritonforge.serving.runtime.Channel` whose sends are timed.

    Only a traced request's channel is wrapped: untraced requests send as before.
    """

    __slots__ = ("_inner", "_trace")

    def __init__(self, inner: Channel, trace: RequestTrace) -> None:
        self._inner = inner
        self._trace = trace

    def send(
        self, tensors: dict[str, npt.NDArray[Any]] | None, error: BaseException | None, final: bool
    ) -> None:
        started = time.perf_counter()
        try:
            self._inner.send(tensors, error, final)
        finally:
            self._trace.sent(started, time.perf_counter(), final)

    def is_cancelled(self) -> bool:
        return self._inner.is_cancelled()


def runtime_tracer(
    model: str, logger: Logger, env: Mapping[str, str] | None = None
) -> RuntimeTracer | None:
    """The tracer of one model's runtime, or None when the environment leaves tracing off."""
    settings = TraceSettings.from_env(env)
    if not settings.enabled:
        return None
    return RuntimeTracer(*span_pipeline(settings, "tritonforge-runtime"), model, logger)


def context_traceparent(context_json: str | None) -> str | None:
    """The ``traceparent`` in a trace context Triton hands a model (a JSON object of
    W3C headers, python_backend's ``request.trace().get_context()``), if any."""
    if not context_json:
        return None
    try:
        headers = json.loads(context_json)
    except ValueError:
        return None
    value = headers.get(TRACEPARENT) if isinstance(headers, dict) else None
    return value if isinstance(value, str) and value else None
