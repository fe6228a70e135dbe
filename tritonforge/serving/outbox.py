"""One request's responses on their way out: coalesced while the sender is busy.

Each request has an :class:`Outbox` between the engine loop, which puts deltas in,
and the response threads, which send them. At most one send job per request is queued
or running at a time, so a request's responses leave in order whichever response
thread takes the job, and everything that reaches Triton for one request (responses,
the FINAL, the cancellation check) is serialised through it.

Coalescing (on by default): deltas that arrive while the request's previous response
is still on its way — the response threads are busy, Triton's IPC is slow, the client
reads slowly — go out together as one response (text joined, ids, logprobs and counts
merged). An idle request's delta is handed to a response thread at once, so a stream
that keeps up gets one token per response and no added latency.

``stream_interval`` (vLLM's ``--stream-interval``): a response carries at least that
many tokens, the last one whatever is left — fewer, fuller responses for
throughput-first deployments, at the cost of latency between them.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from tritonforge.engines.base import EngineOutput
from tritonforge.serving.responses import merge_outputs


@dataclass(frozen=True)
class StreamPolicy:
    """How a request's traffic with Triton goes out (config.pbtxt parameters): its deltas
    as responses, and its cancellation checks, which ride with its send jobs."""

    #: Tokens a response carries at least (the last one: what is left).
    interval: int = 1
    #: Deltas that wait for a busy sender go out together as one response.
    coalesce: bool = True
    #: Response threads of a model instance. A send waits for Triton to take the
    #: response (one stub↔server round trip); several threads overlap those round trips,
    #: the way Triton's own decoupled examples send from a thread per request. Each
    #: thread also competes for the GIL with the engine's loop: on two cores 2 kept
    #: pace with a 10 ms-step engine better than 4 or 8, at less CPU per response
    #: (response-threads and serving-ceiling-per-response in perf/README.md).
    threads: int = 2
    #: How often each request in flight asks Triton whether its client cancelled, in ms
    #: (None: the engine's period). Each check is a stub↔server round trip on a response
    #: thread; upstream TensorRT-LLM's ``cancellation_check_period_ms``.
    cancellation_check_ms: int | None = None

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str]) -> StreamPolicy:
        """Read ``stream_interval``, ``stream_coalescing``, ``response_threads`` and
        ``cancellation_check_period_ms``.

        A bad value fails the load, naming the parameter and its rule.
        """
        default = cls()
        raw = parameters.get("stream_coalescing", "").strip().lower()
        if raw not in ("", "true", "false"):
            raise ValueError(f"parameter stream_coalescing: must be true or false, got {raw!r}")
        return cls(
            interval=_whole(parameters, "stream_interval", "tokens", default.interval),
            coalesce=default.coalesce if not raw else raw == "true",
            threads=_whole(parameters, "response_threads", "threads", default.threads),
            cancellation_check_ms=(
                _whole(parameters, "cancellation_check_period_ms", "milliseconds", 0) or None
            ),
        )

    def cancellation_poll_s(self, engine_default_s: float) -> float:
        """Seconds between a request's cancellation checks: this policy's, else the engine's."""
        if self.cancellation_check_ms is None:
            return engine_default_s
        return self.cancellation_check_ms / 1000


def _whole(parameters: Mapping[str, str], key: str, unit: str, default: int) -> int:
    """Parameter ``key`` as a whole number >= 1 (``default`` when not set)."""
    raw = parameters.get(key, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"parameter {key}: must be a whole number of {unit} >= 1, got {raw!r}")
    return int(raw)


@dataclass(frozen=True)
class Final:
    """How a request ends: its last output and/or error, and its metrics record."""

    output: EngineOutput | None
    error: BaseException | None
    record: object | None


class Batch(NamedTuple):
    """What one send job does, in this order: check cancellation, send, end.

    A tuple, not a frozen dataclass: one is made for every response."""

    poll: bool
    output: EngineOutput | None
    final: Final | None


class Outbox:
    """The responses of one request not sent yet; loop and response threads share it."""

    def __init__(self, policy: StreamPolicy) -> None:
        self.policy = policy
        self._lock = threading.Lock()
        self._pending: deque[EngineOutput] = deque()
        self._final: Final | None = None
        self._poll = False
        self._busy = False  # a send job for this request is queued or running
        self._closed = False  # the FINAL was handed out: nothing more

    # --- the engine loop and the watcher: True means "post a send job" ---------------

    def put(self, output: EngineOutput) -> bool:
        """A streamed delta (text complete); never the last one (see :meth:`finish`)."""
        with self._lock:
            tail = self._pending[-1] if self._pending else None
            if tail is not None and (self.policy.coalesce or not self._full(tail)):
                self._pending[-1] = merge_outputs(tail, output)
            else:
                self._pending.append(output)
            return self._claim()

    def finish(self, final: Final) -> bool:
        """The request's end; everything put before it leaves first."""
        with self._lock:
            if self._final is None:
                self._final = final
            return self._claim()

    def poll(self) -> bool:
        """Ask for a cancellation check, done by the request's next send job."""
        with self._lock:
            if self._closed or self._final is not None:
                return False
            self._poll = True
            return self._claim()

    # --- the response thread running the request's send job --------------------------

    def take(self) -> Batch:
        """What to do now; pending deltas a FINAL follows are folded into it."""
        with self._lock:
            poll, self._poll = self._poll, False
            if self._closed:
                return Batch(poll=False, output=None, final=None)
            sendable = bool(self._pending) and (
                len(self._pending) > 1 or self._ready(self._pending[0])
            )
            if sendable and (self._final is None or not self.policy.coalesce):
                return Batch(poll, self._pending.popleft(), None)
            final = self._final
            if final is None:
                return Batch(poll, None, None)
            self._closed = True
            output = None
            while self._pending:
                output = merge_outputs(output, self._pending.popleft())
            if final.error is None:  # the last output joins what is pending
                if final.output is not None:
                    output = merge_outputs(output, final.output)
                return Batch(False, None, Final(output, None, final.record))
            return Batch(False, output, final)

    def release(self) -> bool:
        """After a send job: True if there is more to do (post another job)."""
        with self._lock:
            if self._has_work():
                return True
            self._busy = False
            return False

    # --- under the lock ----------------------------------------------------------------

    def _full(self, output: EngineOutput) -> bool:
        return len(output.token_ids) >= self.policy.interval

    def _ready(self, output: EngineOutput) -> bool:
        return self.policy.interval <= 1 or self._full(output)

    def _has_work(self) -> bool:
        if self._closed:
            return False
        if self._poll or self._final is not None:
            return True
        return bool(self._pending) and (len(self._pending) > 1 or self._ready(self._pending[0]))

    def _claim(self) -> bool:
        if self._busy or not self._has_work():
            return False
        self._busy = True
        return True
