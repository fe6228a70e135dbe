"""How the suite talks to an endpoint: plain HTTP, the wire as an application sees it.

No OpenAI SDK: the SDK fills in defaults and reshapes answers, and the suite must see
what each server itself sends. The checks take a :class:`Transport`, so the unit tests
replay recorded replies through the same judging code without a server.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

import requests


@dataclass
class Reply:
    """One answer: HTTP status, the parsed JSON body (or the SSE events), its raw head."""

    status: int
    body: Any = None  # parsed JSON, None when the body is not JSON
    events: list[dict[str, Any]] = field(default_factory=list)  # SSE ``data:`` JSON chunks
    done: bool = False  # the stream ended with ``data: [DONE]``
    cut: bool = False  # the client stopped reading (the event budget ran out)
    text: str = ""  # the body's first characters, for an error's evidence

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def error(self) -> str:
        """The server's error message, short, for the evidence."""
        if isinstance(self.body, dict):
            err = self.body.get("error", self.body.get("detail", self.body))
            message = err.get("message", err) if isinstance(err, dict) else err
            return str(message)[:300]
        return self.text[:300]


class Transport(Protocol):
    def post(self, path: str, body: dict[str, Any], max_events: int | None = None) -> Reply: ...

    def get(self, url: str) -> Reply: ...


class HttpTransport:
    """``base_url`` is the API root (``http://host:port/v1``); ``get`` takes a full URL."""

    def __init__(self, base_url: str, timeout_s: float = 120.0, api_key: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.session = requests.Session()
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def post(self, path: str, body: dict[str, Any], max_events: int | None = None) -> Reply:
        url = self.base_url + path
        if not body.get("stream"):
            response = self.session.post(url, json=body, timeout=self.timeout_s)
            return Reply(response.status_code, _json(response.text), text=response.text[:500])
        with self.session.post(url, json=body, timeout=self.timeout_s, stream=True) as response:
            if not 200 <= response.status_code < 300:
                return Reply(response.status_code, _json(response.text), text=response.text[:500])
            return read_sse(response.status_code, response.iter_lines(), max_events)

    def get(self, url: str) -> Reply:
        try:
            response = self.session.get(url, timeout=self.timeout_s)
        except requests.ConnectionError as error:
            return Reply(0, text=f"connection failed: {type(error).__name__}")
        return Reply(response.status_code, _json(response.text), text=response.text)


def read_sse(status: int, lines: Any, max_events: int | None) -> Reply:
    """Server-sent events into a :class:`Reply`; stops reading after ``max_events``
    events (closing the stream, as a client that gives up would)."""
    reply = Reply(status)
    for raw in lines:
        line = raw.decode() if isinstance(raw, bytes) else raw
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            reply.done = True
            break
        parsed = _json(data)
        if isinstance(parsed, dict):
            reply.events.append(parsed)
        if max_events is not None and len(reply.events) >= max_events:
            reply.cut = True
            break
    return reply


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
