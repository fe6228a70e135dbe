"""Every HTTP request's id and trace context, from its headers to its Triton request.

An ASGI middleware, around every route: it takes the client's ``X-Request-Id`` (or
makes one), answers it in the response's ``X-Request-Id`` header — errors included —
and keeps it for the request's Triton call (:func:`current`), which sends it as the
Triton request's id: the engine, the server's logs and its errors then name the id
the client holds. A bad id is a 400 naming the header.

A W3C ``traceparent`` header is passed on to Triton (as gRPC metadata, for Triton's
own OpenTelemetry trace, and as a request parameter, for the model's runtime). With
tracing configured (:class:`~tritonforge.serving.tracing.TraceSettings`) the frontend
adds a span of its own for the request under the client's, and passes that on instead.
With ``TRITONFORGE_LOG_REQUESTS`` on (:mod:`~tritonforge.serving.request_log`), one log
line per API request names its id, status, time and, when traced, its trace.

Nothing here reads a request's body: no prompt reaches a span or a log line.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tritonforge.openai.errors import invalid
from tritonforge.openai.responses import to_json
from tritonforge.serving.errors import RequestError
from tritonforge.serving.otlp_export import SERVER, span
from tritonforge.serving.request_ids import check_request_id, new_request_id
from tritonforge.serving.tracing import TRACEPARENT, Started, Tracer, TraceSettings, tracer

REQUEST_ID_HEADER = "X-Request-Id"
_log = logging.getLogger("tritonforge.openai")


@dataclass(frozen=True)
class RequestContext:
    """What a route's Triton call carries on: the request's id and trace context."""

    request_id: str
    #: The ``traceparent`` for Triton: the frontend's span, else the client's header.
    traceparent: str | None = None


_CURRENT: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar(
    "tritonforge_openai_request", default=None
)


def current() -> RequestContext | None:
    """The HTTP request being served (None outside one: a unit test's direct call)."""
    return _CURRENT.get()


def _is_api(scope: Scope) -> bool:
    """An API request: health probes and metric scrapes are neither traced nor logged."""
    return str(scope.get("path", "")).startswith("/v1/")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


class RequestContextMiddleware:
    """Ids and trace context for every HTTP request (see the module's docstring)."""

    def __init__(
        self, app: ASGIApp, tracer: Tracer | None = None, log_requests: bool = False
    ) -> None:
        self.app = app
        self.tracer = tracer
        self.log_requests = log_requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = _header(scope, b"x-request-id")
        try:
            request_id = new_request_id() if given is None else check_request_id(given, "")
        except RequestError as error:
            await self._refuse(error.rule, send)
            return
        traceparent = _header(scope, TRACEPARENT.encode())
        traced = self._start_span(scope, traceparent)
        if traced is not None:
            traceparent = traced.traceparent
        status = 500
        id_header = (b"x-request-id", request_id.encode())

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                message["headers"] = [*message.get("headers", ()), id_header]
            await send(message)

        token = _CURRENT.set(RequestContext(request_id, traceparent))
        started_ns = time.time_ns()
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            _CURRENT.reset(token)
            ended_ns = time.time_ns()
            if traced is not None:
                self._end_span(traced, scope, request_id, status, started_ns, ended_ns)
            if self.log_requests and _is_api(scope):
                _log.info(
                    "request %s: %s %s -> %d in %.0f ms%s",
                    request_id,
                    scope.get("method", ""),
                    scope.get("path", ""),
                    status,
                    (ended_ns - started_ns) / 1e6,
                    "" if traced is None else f" (trace {traced.trace_id:032x})",
                )

    def _start_span(self, scope: Scope, traceparent: str | None) -> Started | None:
        if self.tracer is None or not _is_api(scope):
            return None
        return self.tracer.start(traceparent)

    def _end_span(
        self,
        traced: Started,
        scope: Scope,
        request_id: str,
        status: int,
        started_ns: int,
        ended_ns: int,
    ) -> None:
        """The request's span, built whole at its end (tracing.py's reasons)."""
        assert self.tracer is not None
        method, path = str(scope.get("method", "")), str(scope.get("path", ""))
        self.tracer.batches.add(
            [
                span(
                    f"{method} {path}",
                    traced.trace_id.to_bytes(16, "big"),
                    traced.span_id,
                    traced.parent_id,
                    started_ns,
                    ended_ns,
                    {
                        "http.request.method": method,
                        "url.path": path,
                        "tritonforge.request_id": request_id,
                        "http.response.status_code": status,
                    },
                    SERVER,
                    f"HTTP {status}" if status >= 500 else None,
                )
            ]
        )

    @staticmethod
    async def _refuse(rule: str, send: Send) -> None:
        error = invalid(f"{REQUEST_ID_HEADER} header: {rule}", REQUEST_ID_HEADER)
        body = to_json(error.body())
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 400, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def frontend_tracer(settings: TraceSettings | None = None) -> Tracer | None:
    """The frontend's tracer, or None when tracing is off (the default)."""
    settings = settings or TraceSettings.from_env()
    if not settings.enabled:
        return None
    return tracer(settings, "tritonforge-openai", "tritonforge.openai")


def triton_call_settings(context: RequestContext | None) -> dict[str, Any]:
    """What a Triton request of ``context`` carries: its id, and the trace context as a
    request parameter (for the model's runtime) — the gRPC metadata is :func:`metadata`."""
    if context is None:
        return {}
    settings: dict[str, Any] = {"request_id": context.request_id}
    if context.traceparent:
        settings["parameters"] = {TRACEPARENT: context.traceparent}
    return settings


def metadata(context: RequestContext | None) -> MutableMapping[str, str] | None:
    """The gRPC metadata of a Triton call of ``context``: ``traceparent``, for Triton's
    own OpenTelemetry trace to join the client's."""
    if context is None or not context.traceparent:
        return None
    return {TRACEPARENT: context.traceparent}
