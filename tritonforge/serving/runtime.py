"""The engine-agnostic serving runtime: one event loop, one response thread.

``execute()`` on Triton's thread only registers a request and hands it to the engine's
event loop, so the engine sees every concurrent request and batches them itself.
Responses, cancellation checks and metric updates cross into the stub's IPC on a
separate response thread, so a slow client or a metrics call never stalls the engine.

Life of a request: ``submit`` (bounded: a full model answers "busy") → ``_serve`` on
the loop (prepare prompt, iterate engine deltas, stream or aggregate) → responses on
the response thread → one record for the metrics. A cancelled client request is
noticed by a periodic poll and aborted in the engine, which ends its iterator. A
request past its deadline (``timeout_s``, or Triton's request ``timeout``) is aborted
too and answered with :class:`~tritonforge.serving.errors.DeadlineExceeded`.

The same poll is the engine's watchdog: once :meth:`Engine.failure` names a cause
(the engine process died, its worker thread ended), every request in flight ends with
UNAVAILABLE naming it, new ones are refused, and ``on_engine_failure`` tells the Triton
edge, which takes the model out of service and brings it back (see triton/model.py).
It also watches the server itself (server_watch.py): once the server is shutting
down, requests in flight get a grace period, then end with UNAVAILABLE, so that the
server can unload the model and exit within its exit timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from tritonforge.engines.base import Engine, EngineOutput, EngineStats, PreparedPrompt
from tritonforge.serving.errors import DeadlineExceeded, EngineBusy, EngineUnavailable, RequestError
from tritonforge.serving.responses import Generation, build_outputs, merge_outputs
from tritonforge.serving.schema import GenerateRequest
from tritonforge.triton.server_watch import UNLOAD_RESERVE_S, ShutdownWatch


class Channel(Protocol):
    """Where one request's responses go (Triton's response sender, at the edge)."""

    def send(
        self, tensors: dict[str, np.ndarray] | None, error: Exception | None, final: bool
    ) -> None:
        """Send output tensors or an error; ``final`` closes the request."""

    def is_cancelled(self) -> bool:
        """True once the client cancelled or went away."""


@dataclass(frozen=True)
class RequestRecord:
    """One finished request, for the metrics."""

    prompt_tokens: int
    generation_tokens: int
    e2e_s: float
    ttft_s: float | None
    tpot_s: float | None
    outcome: str  # finished | cancelled | failed
    lora: str | None = None  # the LoRA adapter it ran with (None: the base model)


@dataclass
class _Timing:
    """What one request's metrics record is made of, gathered while it runs."""

    prompt_tokens: int
    lora: str | None = None
    started: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    generated: int = 0

    def saw(self, delta: EngineOutput) -> None:
        if delta.token_ids and self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self.generated += len(delta.token_ids)

    def record(self, outcome: str) -> RequestRecord:
        ended = time.perf_counter()
        ttft = tpot = None
        if self.first_token_at is not None:
            ttft = self.first_token_at - self.started
            if self.generated > 1:
                tpot = (ended - self.first_token_at) / (self.generated - 1)
        return RequestRecord(
            prompt_tokens=self.prompt_tokens,
            generation_tokens=self.generated,
            e2e_s=ended - self.started,
            ttft_s=ttft,
            tpot_s=tpot,
            outcome=outcome,
            lora=self.lora,
        )


class MetricsSink(Protocol):
    def record(self, record: RequestRecord) -> None: ...

    def set_stats(self, stats: EngineStats) -> None: ...


class Logger(Protocol):
    def log_info(self, msg: str) -> None: ...

    def log_error(self, msg: str) -> None: ...


@dataclass(frozen=True)
class Deadline:
    """When a request must be over (``time.monotonic()``), and the limit that set it."""

    at: float
    seconds: float
    source: str

    @staticmethod
    def tightest(timeout_s: float | None, triton_timeout_s: float | None) -> Deadline | None:
        """The smaller of the client's ``timeout_s`` and Triton's request timeout, from now."""
        now = time.monotonic()
        limits = [
            Deadline(now + seconds, seconds, source)
            for seconds, source in (
                (timeout_s, "timeout_s"),
                (triton_timeout_s, "Triton request timeout"),
            )
            if seconds is not None
        ]
        return min(limits, key=lambda d: d.at, default=None)


@dataclass
class _Inflight:
    channel: Channel
    deadline: Deadline | None = None
    cancelled: bool = False
    task: asyncio.Task | None = None
    #: Why the runtime ended the request (the engine failed), if it did.
    failure: EngineUnavailable | None = None
    #: Its FINAL response went out: nothing more may follow (one FINAL per request).
    closed: bool = False
    #: Its metrics so far; recorded with the FINAL response (see ``Runtime._send``).
    timing: _Timing | None = None


class Runtime:
    """Runs one :class:`Engine` for one Triton model instance."""

    def __init__(
        self,
        engine: Engine,
        metrics: MetricsSink,
        logger: Logger,
        max_inflight: int = 256,
        cancellation_poll_s: float = 0.1,
        drain_timeout_s: float = 5.0,
        on_engine_failure: Callable[[str], None] | None = None,
        shutdown_watch: ShutdownWatch | None = None,
        shutdown_poll_s: float = 1.0,
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        self.logger = logger
        self.max_inflight = max_inflight
        self.cancellation_poll_s = cancellation_poll_s
        self.drain_timeout_s = drain_timeout_s
        self.on_engine_failure = on_engine_failure
        self.shutdown_watch = shutdown_watch
        self.shutdown_poll_s = shutdown_poll_s
        self._server_stopping_at: float | None = None  # monotonic time it was noticed
        self._failure: str | None = None  # set once, when the engine is found dead
        self._inflight: dict[str, _Inflight] = {}
        self._lock = threading.Lock()
        self._closing = False
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(
            target=self._loop.run_forever, name="tritonforge-engine-loop", daemon=True
        )
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._response_thread = threading.Thread(
            target=self._run_jobs, name="tritonforge-responses", daemon=True
        )

    # --- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Start the loop and the engine; raises the engine's start-up error."""
        self._loop_thread.start()
        self._response_thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.engine.start(), self._loop).result()
        except BaseException:
            self._stop_threads()
            raise
        self._watcher = asyncio.run_coroutine_threadsafe(self._watch(), self._loop)

    def stop(self) -> None:
        """Let in-flight requests finish (bounded), fail the rest, stop the engine."""
        with self._lock:
            self._closing = True
        self.logger.log_info(f"[tritonforge] stopping: {len(self._inflight)} request(s) in flight")
        deadline = time.monotonic() + self.drain_timeout_s
        while self._inflight and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=120)
        except Exception as exc:
            self.logger.log_error(f"[tritonforge] engine shutdown failed: {exc!r}")
        self._stop_threads()
        self.logger.log_info("[tritonforge] stopped")

    def _stop_threads(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(timeout=30)
        self._jobs.put(None)
        self._response_thread.join(timeout=30)

    async def _shutdown(self) -> None:
        self._watcher.cancel()
        tasks = [entry.task for entry in self._inflight.values() if entry.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.engine.shutdown()

    # --- request path ----------------------------------------------------------

    def submit(
        self, request: GenerateRequest, channel: Channel, triton_timeout_s: float | None = None
    ) -> None:
        """Hand a parsed request to the engine loop (called on Triton's thread).

        The prompt is prepared here so that its errors are answered from ``execute()``
        itself: an error response sent later, from another thread, never completes
        for a BLS caller in python backend 24.10 and wedges the caller's unload.
        ``triton_timeout_s`` is Triton's own request timeout when the client set one;
        the request's deadline is the smaller of it and ``timeout_s``, counted from here.
        Triton 2.51 workaround W2, see docs/triton-2.51-workarounds.md.
        """
        prepared = self.engine.prepare(request)
        with self._lock:
            if self._failure is not None:
                raise self._failure_error()
            if self._closing:
                raise EngineUnavailable("the model is unloading; no new requests are accepted")
            if len(self._inflight) >= self.max_inflight:
                raise EngineBusy(
                    f"model is busy: {self.max_inflight} requests in flight (max_inflight); "
                    "retry later"
                )
            request_id = uuid.uuid4().hex
            deadline = Deadline.tightest(request.sampling.timeout_s, triton_timeout_s)
            entry = _Inflight(channel, deadline)
            self._inflight[request_id] = entry
        self._loop.call_soon_threadsafe(self._begin, request_id, request, prepared, entry)

    def _begin(
        self, request_id: str, request: GenerateRequest, prepared: PreparedPrompt, entry: _Inflight
    ) -> None:
        entry.task = self._loop.create_task(self._serve(request_id, request, prepared, entry))

    def _post(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def _send(self, entry: _Inflight, tensors: Any, error: Exception | None, final: bool) -> None:
        """Queue one response for the response thread (only ever called on the loop).

        The FINAL response carries the request's metrics record in the same job, counted
        just before the response leaves: a client holding its answer (a test, a canary
        reading the counters) never sees the counters lag behind it.
        """
        if entry.closed:
            return
        entry.closed = final
        record = None
        if final and entry.timing is not None:
            outcome = "finished" if error is None else "cancelled" if entry.cancelled else "failed"
            record = entry.timing.record(outcome)

        def job() -> None:
            try:
                if record is not None:
                    self.metrics.record(record)
            finally:  # a metrics failure is logged by the job loop; the response still goes
                entry.channel.send(tensors, error, final)

        self._post(job)

    async def _serve(
        self, request_id: str, request: GenerateRequest, prepared: PreparedPrompt, entry: _Inflight
    ) -> None:
        """One request from first delta to its single FINAL response and metrics record."""
        timing = entry.timing = _Timing(len(prepared.token_ids), request.sampling.lora_name)
        try:
            deltas = self._deltas(request_id, request, prepared, entry, timing)
            if request.stream:
                await self._stream(deltas, request, entry, timing.prompt_tokens)
            else:
                await self._aggregate(deltas, request, prepared, entry, timing.prompt_tokens)
            if entry.cancelled:
                self._send(entry, None, asyncio.CancelledError("request cancelled"), True)
        except (RequestError, EngineUnavailable) as exc:
            self._send(entry, None, exc, True)
        except DeadlineExceeded as exc:
            await self._abort_quietly(request_id)
            self._send(entry, None, exc, True)  # after a streamed FINAL: nothing more
        except asyncio.CancelledError:
            await self._abort_quietly(request_id)
            error = entry.failure or EngineUnavailable("the model was unloaded mid-request")
            self._send(entry, None, error, True)
            raise
        except Exception as exc:
            await self._abort_quietly(request_id)
            if (cause := self.engine.failure()) is not None:
                self._send(entry, None, self._failure_error(cause), True)
            else:
                self.logger.log_error(f"[tritonforge] request failed: {exc!r}")
                self._send(entry, None, exc, True)
        finally:
            with self._lock:
                self._inflight.pop(request_id, None)
            # Every path above sent the FINAL; this only guards the one-FINAL rule.
            self._send(entry, None, EngineUnavailable("the request ended without an answer"), True)

    async def _deltas(
        self,
        request_id: str,
        request: GenerateRequest,
        prepared: PreparedPrompt,
        entry: _Inflight,
        timing: _Timing,
    ) -> AsyncIterator[EngineOutput]:
        """The engine's deltas until it finishes or the client cancels."""
        if self._failure is not None:  # failed between submit() and now
            raise self._failure_error()
        deltas = self.engine.generate(request_id, prepared, request.sampling)
        async for delta in _until(entry.deadline, deltas):
            if entry.cancelled:
                return
            timing.saw(delta)
            yield delta

    async def _stream(
        self,
        deltas: AsyncIterator[EngineOutput],
        request: GenerateRequest,
        entry: _Inflight,
        prompt_tokens: int,
    ) -> None:
        """One response per delta that completes text; the last carries FINAL."""
        held: EngineOutput | None = None
        finished = False
        async for delta in deltas:
            finished = delta.finished
            # Tokens whose text is not complete yet (half a UTF-8 character, a possible
            # stop string) ride with the response that completes it, so each response's
            # output_ids decode to exactly its text_output. A stateless detokenizer
            # downstream (the ensemble's postprocessing) then streams exact text without
            # keeping per-request state.
            held = merge_outputs(held, delta)
            if held.text or finished:
                self._send(
                    entry, build_outputs(held, request.returns, prompt_tokens), None, finished
                )
                held = None
        if entry.cancelled:
            return
        if held is not None:  # the engine stopped mid-character: flush, close
            self._send(entry, build_outputs(held, request.returns, prompt_tokens), None, True)
        elif not finished:  # the engine stopped without a final delta: close
            self._send(entry, None, None, True)

    async def _aggregate(
        self,
        deltas: AsyncIterator[EngineOutput],
        request: GenerateRequest,
        prepared: PreparedPrompt,
        entry: _Inflight,
        prompt_tokens: int,
    ) -> None:
        """One response with the whole generation (the prompt first, when echoed)."""
        generation = Generation()
        async for delta in deltas:
            generation.add(delta)
        if entry.cancelled:
            return
        prefix = prepared.text if request.prepend_input and prepared.text else ""
        outputs = build_outputs(generation.as_output(), request.returns, prompt_tokens, prefix)
        self._send(entry, outputs, None, True)

    async def _abort_quietly(self, request_id: str) -> None:
        with contextlib.suppress(Exception):
            await self.engine.abort(request_id)

    # --- cancellation and gauges ------------------------------------------------

    async def _watch(self) -> None:
        """Every poll interval: cancelled clients, the engine's health, the gauges."""
        next_server_poll = 0.0
        while True:
            await asyncio.sleep(self.cancellation_poll_s)
            self._post(self._poll_cancellations)
            if self._failure is None and (cause := self.engine.failure()) is not None:
                self._engine_failed(cause)
            if self.shutdown_watch is not None and time.monotonic() >= next_server_poll:
                next_server_poll = time.monotonic() + self.shutdown_poll_s
                await self._watch_server(self.shutdown_watch)
            stats = self.engine.stats()
            if not self._inflight:
                # The engine cannot be busy with requests we no longer have; its last
                # stats snapshot may predate the step that finished them.
                stats = EngineStats(0, 0, stats.kv_cache_usage)
            self._post(lambda s=stats: self.metrics.set_stats(s))

    async def _watch_server(self, watch: ShutdownWatch) -> None:
        """Server shutting down: give requests in flight their grace, then end them."""
        grace_s = watch.settings.grace_s()
        if self._server_stopping_at is None:
            if not await watch.poll():
                return
            self._server_stopping_at = time.monotonic()
            with self._lock:
                self._closing = True
            self.logger.log_info(
                f"[tritonforge] the server is shutting down: {len(self._inflight)} request(s) "
                f"in flight may run {grace_s:g} s more (exit timeout "
                f"{watch.settings.exit_timeout_s:g} s)"
            )
        if self._inflight and time.monotonic() - self._server_stopping_at >= grace_s:
            ended = self._end_inflight(
                EngineUnavailable(
                    f"the server is shutting down; the request did not finish within the "
                    f"{grace_s:g} s it was given (the server's exit timeout "
                    f"{watch.settings.exit_timeout_s:g} s less {UNLOAD_RESERVE_S:g} s)"
                )
            )
            self.logger.log_info(f"[tritonforge] shutting down: ended {ended} request(s)")

    def _end_inflight(self, error: EngineUnavailable) -> int:
        """On the loop: end every request in flight with ``error``; returns how many."""
        with self._lock:
            inflight = list(self._inflight.values())
        for entry in inflight:
            entry.failure = error
            if entry.task is not None:
                entry.task.cancel()
        return len(inflight)

    def _failure_error(self, cause: str | None = None) -> EngineUnavailable:
        return EngineUnavailable(
            f"the engine failed ({cause or self._failure}); the model is being restarted"
        )

    def _engine_failed(self, cause: str) -> None:
        """On the loop: end every request in flight, refuse new ones, tell the edge."""
        with self._lock:
            self._failure = cause
        ended = self._end_inflight(self._failure_error())
        self.logger.log_error(
            f"[tritonforge] engine failed: {cause}; ended {ended} request(s) in flight"
        )
        if self._server_stopping_at is not None:
            return  # the server is going away: nothing to restart
        if self.on_engine_failure is not None:
            callback = self.on_engine_failure
            self._post(lambda: callback(cause))

    @property
    def failure(self) -> str | None:
        """Why the engine stopped serving, once the watchdog found it dead."""
        return self._failure

    def _poll_cancellations(self) -> None:
        """Runs on the response thread: is_cancelled() is an IPC round trip."""
        for request_id, entry in list(self._inflight.items()):
            if entry.cancelled:
                continue
            try:
                cancelled = entry.channel.is_cancelled()
            except Exception:
                cancelled = True
            if cancelled:
                self._loop.call_soon_threadsafe(self._cancel, request_id, entry)

    def _cancel(self, request_id: str, entry: _Inflight) -> None:
        entry.cancelled = True
        self._loop.create_task(self._abort_quietly(request_id))

    def _run_jobs(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                job()
            except Exception as exc:
                self.logger.log_error(f"[tritonforge] response thread: {exc!r}")


async def _until(
    deadline: Deadline | None, deltas: AsyncIterator[EngineOutput]
) -> AsyncIterator[EngineOutput]:
    """The engine's deltas until ``deadline``; past it, raise :class:`DeadlineExceeded`.

    The wait for each delta is bounded, not just checked between deltas, so a request
    ends on time whatever the engine is doing with it (queued behind others, evaluating
    a long prompt). Expiry cancels that wait inside the engine's iterator, which closes
    it and releases the engine request; the runtime then aborts the request as well.
    """
    if deadline is None:
        async for delta in deltas:
            yield delta
        return
    while True:
        expiry = asyncio.timeout(deadline.at - time.monotonic())
        try:
            async with expiry:
                delta = await anext(deltas)
        except StopAsyncIteration:
            return
        except TimeoutError:
            if not expiry.expired():
                raise  # the engine's own TimeoutError: a failure like any other
            raise DeadlineExceeded(deadline.seconds, deadline.source) from None
        yield delta
