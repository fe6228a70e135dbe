"""Requests carried over a tritonserver restart: the rules, and where requests wait.

When tritonserver dies, the launcher restarts it while this frontend runs on; every
Triton call in flight fails with gRPC's UNAVAILABLE (:class:`~.errors.TritonDown`), and
so does every call made until the server is back. A request that has sent its client
nothing yet — a non-streamed one until its answer, a streamed one until its first
token — waits here until its model is ready on the restarted server and is sent again,
under the same request id (the HTTP request's context carries it). The rules:

- **Never a replayed stream.** A stream that sent its client a token ends with
  :func:`stream_restarted` (an error event naming the restart and the tokens sent, then
  ``[DONE]``): a replay would give the client a second beginning of the answer.
- **The deadline counts from the first arrival.** A request's deadline is its body's
  ``timeout_s`` from when it reached this frontend; the resent request carries what is
  left of it as its ``timeout_s``, so the model's deadline stays where it was. A request
  without one waits for the restarted server at most ``max_wait_s`` (the frontend's
  ``--restart-wait``) from its arrival. A deadline that passes while the request waits
  ends it with :func:`restart_deadline_passed`, which names the restart.
- **The waiting room is bounded.** At most ``max_waiting`` requests (``--max-waiting``)
  wait for the server at once; past that, 503 with ``Retry-After`` as before.

Requests arriving during the outage take the same path: their first call fails at once,
and they wait. One poll per model (not per request) asks Triton whether the model is
ready again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tritonforge.openai.errors import TRITON_DOWN_RETRY_AFTER_S, OpenAIError, TritonDown

T = TypeVar("T")

#: Seconds a request without ``timeout_s`` waits for a restarted server: a cold start of
#: ``make serve``'s models takes about a minute here (docs/features/reliability.md).
DEFAULT_MAX_WAIT_S = 300.0
#: Requests that may wait for the server at once.
DEFAULT_MAX_WAITING = 1024
#: How often a waited-for model's readiness is asked.
POLL_S = 0.5


@dataclass(frozen=True)
class CarryOverSettings:
    """The frontend's bounds on waiting for a restarted server."""

    max_waiting: int = DEFAULT_MAX_WAITING
    max_wait_s: float = DEFAULT_MAX_WAIT_S
    poll_s: float = POLL_S


def timeout_of(sampling: Mapping[str, Any]) -> float | None:
    """The body's ``timeout_s`` in seconds, None without a valid one (the model refuses a
    bad one by name; here it only means no deadline of the client's own)."""
    raw = sampling.get("timeout_s")
    if isinstance(raw, bool) or raw is None:
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None


@dataclass
class Clock:
    """One request's deadline, counted from when it first reached this frontend."""

    timeout_s: float | None  # the body's timeout_s; None: no deadline of its own
    arrived: float = field(default_factory=time.monotonic)

    def deadline(self, settings: CarryOverSettings) -> float:
        """When waiting for a restarted server must end (monotonic)."""
        wait = self.timeout_s if self.timeout_s is not None else settings.max_wait_s
        return self.arrived + wait

    def resend_timeout_s(self, now: float) -> float | None:
        """The ``timeout_s`` a resent request carries: what is left of its deadline (None:
        it had none). At most 0 once the deadline passed."""
        if self.timeout_s is None:
            return None
        return self.arrived + self.timeout_s - now


def restart_deadline_passed(model: str, clock: Clock, settings: CarryOverSettings) -> OpenAIError:
    """503: tritonserver restarted and the request's deadline passed before its model was
    ready again."""
    if clock.timeout_s is not None:
        bound = f"its timeout_s of {clock.timeout_s:g} s"
    else:
        bound = f"this frontend's --restart-wait of {settings.max_wait_s:g} s"
    return OpenAIError(
        503,
        f"tritonserver restarted (it stopped while this request waited) and `{model}` was "
        f"not ready again within {bound} from the request's arrival; retry",
        "server_error",
        None,
        "server_restarted",
        TRITON_DOWN_RETRY_AFTER_S,
    )


def waiting_room_full(limit: int) -> OpenAIError:
    """503 with Retry-After: ``limit`` requests already wait for tritonserver's restart."""
    return OpenAIError(
        503,
        f"Triton is restarting and {limit} requests already wait for it (--max-waiting); "
        "retry later",
        "server_error",
        None,
        "service_unavailable",
        TRITON_DOWN_RETRY_AFTER_S,
    )


def stream_restarted(tokens_sent: int) -> OpenAIError:
    """A stream's end when tritonserver stopped after it had sent tokens: never replayed."""
    return OpenAIError(
        503,
        f"tritonserver restarted after this stream had sent {tokens_sent} tokens; the answer "
        "is incomplete, and a stream that sent tokens is never sent again: retry the request",
        "server_error",
        None,
        "server_restarted",
        TRITON_DOWN_RETRY_AFTER_S,
    )


def may_resend(characters_sent: int) -> bool:
    """Whether a request whose Triton call failed may be sent again: only while its client
    got no character of the answer (a stream's opening role chunk carries none)."""
    return characters_sent == 0


class CarryOver:
    """Where requests wait for a restarted server; ``model_ready`` asks Triton."""

    def __init__(
        self,
        model_ready: Callable[[str], Awaitable[bool]],
        settings: CarryOverSettings | None = None,
    ) -> None:
        self.settings = settings or CarryOverSettings()
        self._model_ready = model_ready
        self._polls: dict[str, asyncio.Task[None]] = {}
        #: Requests waiting now.
        self.waiting = 0

    async def _poll(self, model: str) -> None:
        while not await self._model_ready(model):
            await asyncio.sleep(self.settings.poll_s)

    async def wait_for(self, model: str, clock: Clock) -> None:
        """Return once ``model`` is ready; the restart's 503 if the request's deadline
        passes first, or the waiting room's if it is full."""
        left = clock.deadline(self.settings) - time.monotonic()
        if left <= 0:
            raise restart_deadline_passed(model, clock, self.settings)
        if self.waiting >= self.settings.max_waiting:
            raise waiting_room_full(self.settings.max_waiting)
        poll = self._polls.get(model)
        if poll is None or poll.done():
            poll = asyncio.ensure_future(self._poll(model))
            self._polls[model] = poll
        self.waiting += 1
        try:
            async with asyncio.timeout(left):
                await asyncio.shield(poll)  # one waiter's cancel never ends the others' poll
        except TimeoutError:
            raise restart_deadline_passed(model, clock, self.settings) from None
        finally:
            self.waiting -= 1
            if self.waiting == 0 and not poll.done():
                poll.cancel()  # nobody waits: stop asking
                with contextlib.suppress(asyncio.CancelledError):
                    await poll

    async def run(
        self,
        model: str,
        clock: Clock,
        attempt: Callable[[int], Awaitable[T]],
        resends: int = 0,
    ) -> T:
        """``attempt(resends)``'s result; each time it fails because Triton is down, wait
        for ``model`` and call it again. ``attempt`` must have sent the client nothing;
        ``resends`` > 0: the first call is already a resend."""
        while True:
            try:
                return await attempt(resends)
            except TritonDown:
                await self.wait_for(model, clock)
                resends += 1

    def prepare_resend(
        self, sampling: dict[str, Any], model: str, clock: Clock, resends: int
    ) -> None:
        """Before a resend: its ``timeout_s`` becomes what is left of its deadline; the
        restart's 503 if nothing is."""
        if resends == 0:
            return
        left = clock.resend_timeout_s(time.monotonic())
        if left is None:
            return
        if left <= 0:
            raise restart_deadline_passed(model, clock, self.settings)
        sampling["timeout_s"] = round(left, 3)
