"""One id per request, from the client to the engine: the rules every layer applies.

A request's id is the one its client gave (the OpenAI frontend's ``X-Request-Id``, a
Triton request's ``id``), else one made here; the runtime hands it to the engine as
the engine's own request id, and every log line and error about the request names it.
Here, not in the runtime, so the frontend checks a header by the same rules without
importing the serving core's engine side.
"""

from __future__ import annotations

import uuid

from tritonforge.serving.errors import RequestError

#: Longest id accepted: room for a UUID with a prefix, short enough for every log line.
MAX_REQUEST_ID_CHARS = 128


def new_request_id() -> str:
    """An id for a request that came without one (32 hex digits, as a W3C trace id)."""
    return uuid.uuid4().hex


def check_request_id(value: str, field: str) -> str:
    """``value`` if it is a usable id, else a :class:`RequestError` naming ``field``.

    Visible ASCII only (no spaces or control characters): the id goes into log lines,
    error messages, HTTP headers and span attributes unescaped, and an engine keys
    its requests by it.
    """
    if not value:
        raise RequestError(field, "must not be empty (omit it and the server makes one)")
    if len(value) > MAX_REQUEST_ID_CHARS:
        raise RequestError(field, f"must be at most {MAX_REQUEST_ID_CHARS} characters")
    if not all("!" <= c <= "~" for c in value):
        raise RequestError(field, "must be visible ASCII characters only (no spaces)")
    return value


class DuplicateRequestId(RequestError):
    """A request whose id is already in flight on the same model (INVALID_ARG).

    Two requests under one id would be one in the engine (vLLM refuses, or worse
    aborts the other on cancel) and indistinguishable in logs and traces.
    """

    def __init__(self, request_id: str, field: str = "id") -> None:
        self.request_id = request_id
        super().__init__(
            field,
            f"request id {request_id!r} is already in flight on this model; ids must be "
            "unique among requests in flight (or omitted: the server makes one)",
        )
