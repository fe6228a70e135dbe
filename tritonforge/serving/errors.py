"""Errors that travel back to the client.

Inside the core, bad input is raised as :class:`RequestError`; the Triton edge turns it
into an error response (INVALID_ARG) whose message names the field and the rule it
broke, so a client can fix the request without reading server logs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


def printable(name: str) -> str:
    """``name`` with its unprintable characters escaped (NUL → ``\\x00``).

    A field name comes from the client (a sampling key is any JSON string). Triton
    carries error messages as C strings, so a NUL would cut the message short at the
    name it is meant to show, and other control characters would garble logs.
    """
    if name.isprintable():
        return name
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in name)


class RequestError(ValueError):
    """A request broke a rule: ``field`` names where (``sampling_parameters.top_p``)."""

    def __init__(self, field: str, rule: str) -> None:
        self.field = field
        self.rule = rule
        super().__init__(f"{printable(field)}: {rule}")


def engine_refusal(exc: Exception, keys: Iterable[str]) -> RequestError:
    """An engine's refusal of a request it was handed, as a :class:`RequestError`.

    Engines check their arguments as they take a request and raise their own errors
    (vLLM's ``VLLMValidationError``, a plain ``ValueError``): those are the client's to
    fix, so they travel as an invalid argument naming the sampling key they concern —
    the error's own ``parameter`` when it carries one, else the first of ``keys`` its
    message names — and the engine's words as the rule.
    """
    message = str(exc) or type(exc).__name__
    named = getattr(exc, "parameter", None)
    if not isinstance(named, str) or not named:
        found = [
            (match.start(), key)
            for key in keys
            if (match := re.search(rf"(?<![\w.]){re.escape(key)}(?!\w)", message)) is not None
        ]
        named = min(found)[1] if found else None
    field = "sampling_parameters" if named is None else f"sampling_parameters.{named}"
    return RequestError(field, f"refused by the engine: {message}")


class EngineBusy(RuntimeError):
    """The model's bounded queue is full; the client should retry later (UNAVAILABLE)."""

    @classmethod
    def at_bound(cls, who: str, max_inflight: int) -> EngineBusy:
        """The refusal of a request past ``max_inflight``, worded alike by every model that
        bounds its requests: the OpenAI frontend answers 503 on "is busy", and a client
        reads the bound (and the setting that raises it) from the message."""
        return cls(f"{who} is busy: {max_inflight} requests in flight (max_inflight); retry later")


class EngineUnavailable(RuntimeError):
    """The engine is shutting down or failed; the request was not (fully) served."""


class DeadlineExceeded(RuntimeError):
    """A request ran past its deadline and was aborted in the engine.

    Triton 2.51's python backend has no DEADLINE_EXCEEDED code; the edge answers
    UNAVAILABLE, as Triton itself does for a request whose timeout expires in a
    scheduler queue ("Request timeout expired"). The message names the limit.
    """

    def __init__(self, seconds: float, source: str) -> None:
        self.seconds = seconds
        self.source = source
        super().__init__(
            f"deadline exceeded: the request ran longer than its {source} of {seconds:g} s "
            "and was aborted"
        )
