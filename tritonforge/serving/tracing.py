"""OpenTelemetry traces of requests: off unless an OTLP endpoint is configured.

Turned on per process by the environment (``TRITONFORGE_OTLP_ENDPOINT``, else the SDK's
own ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``; ``TRITONFORGE_TRACE_SAMPLING`` the ratio of
requests without a sampled parent to trace), so the launcher, the server's stubs and the
OpenAI frontend all follow one setting. Off, nothing here is built: the runtime holds no
tracer, a request no trace, and its per-token path is what it was.

On, a request's spans are built when it ends, from times the runtime records anyway
(:class:`~tritonforge.serving.runtime` keeps submit, start, first and last token for
its metrics); only its sends are timed on the way, by a channel wrapped around the
request's own (:class:`TracedChannel`). They are made as OTLP protobuf messages and
leave in batches (:mod:`tritonforge.serving.otlp_export`). The spans, under one
``tritonforge.request`` span whose parent is the caller's W3C ``traceparent`` (Triton's
own span of the request when Triton traces, else the client's):

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
import random
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from tritonforge.serving.admission import SloUnattainable
from tritonforge.serving.errors import RequestError
from tritonforge.serving.otlp_export import SERVER, HttpSender, SpanBatches, span

if TYPE_CHECKING:
    import numpy.typing as npt
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    from tritonforge.engines.base import EngineOutput
    from tritonforge.serving.runtime import Channel
    from tritonforge.serving.schema import GenerateRequest

#: The W3C header (and Triton request parameter) that carries a trace's context.
TRACEPARENT = "traceparent"
ENDPOINT_ENV = "TRITONFORGE_OTLP_ENDPOINT"
OTEL_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
SAMPLING_ENV = "TRITONFORGE_TRACE_SAMPLING"

#: W3C trace context: version-traceid-parentid-flags (a later version may add fields).
_TRACEPARENT = re.compile(
    r"^\s*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?\s*$"
)

#: The ``traceparent`` of the traced request an engine call serves (its task's context).
_ENGINE_TRACE: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tritonforge_engine_trace", default=None
)


def engine_trace_headers() -> dict[str, str] | None:
    """W3C headers for an engine that traces requests itself (vLLM's request span), so
    its span joins the request's trace under ``tritonforge.request``; None when the
    request being served is not traced."""
    traceparent = _ENGINE_TRACE.get()
    return None if traceparent is None else {TRACEPARENT: traceparent}


class Parent(NamedTuple):
    """The caller's span, from its ``traceparent``."""

    trace_id: int
    span_id: int
    sampled: bool


def parse_traceparent(value: str | None) -> Parent | None:
    """The span a ``traceparent`` names (None: absent or malformed), by the W3C rules the
    SDK's propagator follows: version ``ff`` and all-zero ids are invalid, version 00
    has nothing after its flags."""
    if not value:
        return None
    found = _TRACEPARENT.match(value)
    if found is None:
        return None
    version, trace_hex, span_hex, flags, rest = found.groups()
    if version == "ff" or (version == "00" and rest):
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if not trace_id or not span_id:
        return None
    return Parent(trace_id, span_id, bool(int(flags, 16) & 1))


def format_traceparent(trace_id: int, span_id: int) -> str:
    """The ``traceparent`` that makes this (sampled) span the parent of the next hop's."""
    return f"00-{trace_id:032x}-{span_id:016x}-01"


def _new_id(bits: int) -> int:
    while True:
        value = random.getrandbits(bits)
        if value:
            return value


class Started(NamedTuple):
    """A sampled span's identity, decided when it starts."""

    trace_id: int
    span_id: int
    parent_id: int | None

    @property
    def traceparent(self) -> str:
        return format_traceparent(self.trace_id, self.span_id)


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


class Tracer:
    """One process's (one model's) spans: who is sampled, and where their spans go.

    Sampling is OpenTelemetry's parent-based ratio rule: a caller's span decides by its
    sampled flag; a request without one is sampled when its new trace id's low 64 bits
    fall under ``sampling * 2**64`` (the SDK's ``TraceIdRatioBased``), so every process
    of a trace decides alike.
    """

    def __init__(self, sampling: float, batches: SpanBatches) -> None:
        self.bound = round(sampling * 2**64)
        self.batches = batches

    def start(self, traceparent: str | None) -> Started | None:
        """A new span under ``traceparent`` (or a new trace), or None if not sampled."""
        parent = parse_traceparent(traceparent)
        if parent is not None:
            if not parent.sampled:
                return None
            return Started(parent.trace_id, _new_id(64), parent.span_id)
        trace_id = _new_id(128)
        if trace_id & 0xFFFFFFFFFFFFFFFF >= self.bound:
            return None
        return Started(trace_id, _new_id(64), None)

    def flush(self) -> None:
        self.batches.flush()

    def shutdown(self) -> None:
        """Send what is left (a model unloading: its last requests' spans too)."""
        self.batches.shutdown()


def tracer(
    settings: TraceSettings,
    service: str,
    scope: str,
    send: Callable[[bytes], None] | None = None,
    env: Mapping[str, str] | None = None,
) -> Tracer:
    """A tracer of this process's own; spans leave on its batches' thread, so a request
    never waits for the collector. ``send`` replaces the OTLP/HTTP POST (tests keep the
    export requests)."""
    if send is None:
        assert settings.endpoint, "tracing needs an endpoint"
        send = HttpSender(settings.endpoint)
    batches = SpanBatches.from_env(service, scope, send, os.environ if env is None else env)
    return Tracer(settings.sampling, batches)


class _Clock:
    """``time.perf_counter()`` seconds as epoch nanoseconds (what spans are stamped in)."""

    __slots__ = ("offset_ns",)

    def __init__(self) -> None:
        self.offset_ns = time.time_ns() - time.perf_counter_ns()

    def ns(self, perf_s: float) -> int:
        return int(perf_s * 1e9) + self.offset_ns


class RuntimeTracer:
    """Starts one :class:`RequestTrace` per sampled request of one model."""

    def __init__(self, tracer: Tracer, model: str) -> None:
        self.tracer = tracer
        self.model = model

    def begin(
        self, request_id: str, request: GenerateRequest, traceparent: str | None
    ) -> RequestTrace | None:
        """The request's trace, or None if it is not sampled (then nothing more is done)."""
        started = self.tracer.start(traceparent)
        if started is None:
            return None
        attributes: dict[str, Any] = {
            "tritonforge.request_id": request_id,
            "gen_ai.operation.name": "chat" if request.messages is not None else "text_completion",
            "gen_ai.request.model": self.model,
            "gen_ai.request.max_tokens": request.sampling.max_tokens,
            "tritonforge.stream": request.stream,
        }
        return RequestTrace(self, started, attributes)

    def flush(self) -> None:
        """Send the spans queued so far now (tests)."""
        self.tracer.flush()

    def shutdown(self) -> None:
        """Export what is left (a model unloading): spans of its last requests too."""
        self.tracer.shutdown()


class RequestTrace:
    """One traced request: its root span's identity, and the times its spans are built from.

    Sends are timed on response threads, the rest on the engine's loop; the spans are
    built once, by :meth:`end`, after the FINAL response went out.
    """

    def __init__(
        self,
        tracer: RuntimeTracer,
        root: Started,
        attributes: dict[str, Any],
    ) -> None:
        self.tracer = tracer
        self.root = root
        self.attributes = attributes
        self.clock = _Clock()
        self.submitted = time.perf_counter()
        self.sends = 0
        self.send_busy_s = 0.0
        self.first_send: float | None = None
        self.last_send_end: float | None = None
        self.final_send: tuple[float, float] | None = None
        self._admission: Span | None = None
        self._lock = threading.Lock()
        self._ended = False

    def enter_engine(self) -> None:
        """Make the request's root span the parent of the engine's own spans: called in
        the task that runs the request's engine call (:func:`engine_trace_headers`)."""
        _ENGINE_TRACE.set(self.root.traceparent)

    def channel(self, inner: Channel) -> TracedChannel:
        """``inner`` with every send timed for this trace."""
        return TracedChannel(inner, self)

    def _span(
        self,
        name: str,
        start: float,
        end: float,
        attributes: Mapping[str, Any] | None = None,
        error: str | None = None,
    ) -> Span:
        """A finished child of the request's root span."""
        clock = self.clock
        return span(
            name,
            self.root.trace_id.to_bytes(16, "big"),
            _new_id(64),
            self.root.span_id,
            clock.ns(start),
            clock.ns(end),
            attributes,
            error=error,
        )

    def admitted(
        self, decision: str, predicted_ttft_s: float | None, started: float, ended: float
    ) -> None:
        """The admission span of a request admission let in (``decision``: its counter's label)."""
        attributes: dict[str, Any] = {"tritonforge.admission.decision": decision}
        if predicted_ttft_s is not None:
            attributes["tritonforge.admission.predicted_ttft_ms"] = predicted_ttft_s * 1000
        self._admission = self._span("tritonforge.admission", started, ended, attributes)

    def refused(self, error: BaseException) -> None:
        """The request never reached the engine (admission, a full model, a bad id…)."""
        now = time.perf_counter()
        spans = [] if self._admission is None else [self._admission]
        if isinstance(error, SloUnattainable):
            spans.append(
                self._span(
                    "tritonforge.admission",
                    self.submitted,
                    now,
                    {"tritonforge.admission.decision": "refused"},
                    str(error),
                )
            )
        self._finish(spans, "refused", error, now)

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
        spans = [] if self._admission is None else [self._admission]
        if started is not None:
            spans.append(self._span("tritonforge.queue", self.submitted, started))
            if first_token_at is not None:
                spans.append(
                    self._span(
                        "tritonforge.prefill",
                        started,
                        first_token_at,
                        {"gen_ai.usage.input_tokens": prompt_tokens or 0},
                    )
                )
                root["gen_ai.server.time_to_first_token"] = first_token_at - started
                if last_token_at is not None:
                    spans.append(
                        self._span(
                            "tritonforge.decode",
                            first_token_at,
                            last_token_at,
                            {"gen_ai.usage.output_tokens": output_tokens},
                        )
                    )
        if self.first_send is not None and self.last_send_end is not None:
            spans.append(
                self._span(
                    "tritonforge.sends",
                    self.first_send,
                    self.last_send_end,
                    {
                        "tritonforge.sends.count": self.sends,
                        "tritonforge.sends.busy_ms": self.send_busy_s * 1000,
                    },
                )
            )
        if self.final_send is not None:
            spans.append(self._span("tritonforge.response.final", *self.final_send))
        if prompt_tokens is not None:
            root["gen_ai.usage.input_tokens"] = prompt_tokens
        root["gen_ai.usage.output_tokens"] = output_tokens
        reasons = finish_reasons(output)
        if reasons:
            root["gen_ai.response.finish_reasons"] = tuple(reasons)
        ended = self.final_send[1] if self.final_send is not None else time.perf_counter()
        self._finish(spans, outcome, error, ended)

    def _finish(
        self,
        spans: list[Span],
        outcome: str,
        error: BaseException | None,
        ended: float,
    ) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self.attributes["tritonforge.outcome"] = outcome
        why = None
        if error is not None:
            why = "cancelled by the client" if outcome == "cancelled" else str(error)
            why = why or type(error).__name__
        root = self.root
        spans.append(
            span(
                "tritonforge.request",
                root.trace_id.to_bytes(16, "big"),
                root.span_id,
                root.parent_id,
                self.clock.ns(self.submitted),
                self.clock.ns(ended),
                self.attributes,
                SERVER,
                why,
            )
        )
        self.tracer.tracer.batches.add(spans)


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


def runtime_tracer(model: str, env: Mapping[str, str] | None = None) -> RuntimeTracer | None:
    """The tracer of one model's runtime, or None when the environment leaves tracing off."""
    settings = TraceSettings.from_env(env)
    if not settings.enabled:
        return None
    return RuntimeTracer(
        tracer(settings, "tritonforge-runtime", "tritonforge.serving", env=env), model
    )


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
