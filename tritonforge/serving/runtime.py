"""The engine-agnostic serving runtime: one event loop, a few response threads.

``execute()`` on Triton's thread only registers a request and hands it to the engine's
event loop, so the engine sees every concurrent request and batches them itself.
Responses, cancellation checks and metric updates cross into the stub's IPC on
response threads, so a slow client or a metrics call never stalls the engine; each
request's outbox (outbox.py) keeps its responses in order and coalesces the deltas
that arrive while one is on its way. A request's first response overtakes the others'
next ones: its client is waiting for a first token, theirs only for more.

Life of a request: ``submit`` (bounded: a full model answers "busy") → ``_serve`` on
the loop (prepare prompt, take each delta the engine pushes, stream or aggregate) → its
outbox → responses on a response thread → one record for the metrics. A cancelled client
request is noticed by a periodic poll and aborted in the engine, which ends its deltas. A
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
import concurrent.futures
import contextlib
import dataclasses
import functools
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy.typing as npt

from tritonforge.engines.base import Engine, EngineOutput, EngineStats, PreparedPrompt
from tritonforge.serving.admission import ADMITTED, NO_SLO, Admission
from tritonforge.serving.errors import (
    DeadlineExceeded,
    EngineBusy,
    EngineUnavailable,
    RequestError,
    engine_refusal,
)
from tritonforge.serving.outbox import Final, Outbox, StreamPolicy
from tritonforge.serving.request_ids import DuplicateRequestId, new_request_id
from tritonforge.serving.request_log import request_line
from tritonforge.serving.responses import Generation, build_outputs, merge_outputs
from tritonforge.serving.sampling import SAMPLING_KEYS
from tritonforge.serving.schema import GenerateRequest
from tritonforge.triton.server_watch import UNLOAD_RESERVE_S, ShutdownWatch

if TYPE_CHECKING:
    from tritonforge.serving.tracing import RequestTrace, RuntimeTracer

T = TypeVar("T")

#: Rounds one send job of a request runs before it yields to other requests' jobs.
SENDS_PER_JOB = 8


class Channel(Protocol):
    """Where one request's responses go (Triton's response sender, at the edge)."""

    def send(
        self, tensors: dict[str, npt.NDArray[Any]] | None, error: BaseException | None, final: bool
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
    #: Time per output token after the first, one sample per token: vLLM's (and so
    #: vllm_backend's) ``time_per_output_token_seconds`` is observed once per token.
    token_gaps_s: tuple[float, ...] = ()
    #: Sequences the request asked for (its ``n``).
    n: int = 1


@dataclass
class _Timing:
    """What one request's metrics record is made of, gathered while it runs."""

    prompt_tokens: int
    lora: str | None = None
    n: int = 1
    started: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    last_token_at: float = 0.0
    generated: int = 0
    gaps: list[float] = field(default_factory=list)

    def saw(self, delta: EngineOutput) -> None:
        """Count a delta's tokens; each token after the first gets its share of the wait.

        A delta of several tokens (an engine step that made more than one) spreads the
        time since the previous delta over them; tokens that came with the first one
        waited for nothing more than it.
        """
        count = len(delta.token_ids)
        if not count:
            return
        now = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = now
            self.gaps.extend([0.0] * (count - 1))
        else:
            self.gaps.extend([(now - self.last_token_at) / count] * count)
        self.last_token_at = now
        self.generated += count

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
            token_gaps_s=tuple(self.gaps),
            n=self.n,
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
    request_id: str
    channel: Channel
    outbox: Outbox
    deadline: Deadline | None = None
    cancelled: bool = False
    task: asyncio.Task[None] | None = None
    #: Why the runtime ended the request (the engine failed), if it did.
    failure: EngineUnavailable | None = None
    #: Its FINAL response went out: nothing more may follow (one FINAL per request).
    closed: bool = False
    #: An output or its end reached its outbox: later send jobs take the common lane.
    started: bool = False
    #: Its metrics so far; recorded with the FINAL response (see ``Runtime._send``).
    timing: _Timing | None = None
    #: An engine output → its response tensors (the outputs the request asked for).
    build: Callable[[EngineOutput], dict[str, npt.NDArray[Any]]] | None = None
    #: Its trace (tracing.py) when it is traced; None costs the request nothing.
    trace: RequestTrace | None = None


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
        stream_policy: StreamPolicy | None = None,
        response_threads: int | None = None,
        admission: Admission | None = None,
        tracer: RuntimeTracer | None = None,
        log_requests: bool = False,
    ) -> None:
        self.engine = engine
        #: SLO-aware admission (admission.py); None: every request within max_inflight runs.
        self.admission = admission
        #: Traces requests (tracing.py); None, the default: tracing is off.
        self.tracer = tracer
        #: One log line per request that ended (request_log.py); off by default.
        self.log_requests = log_requests
        self.metrics = metrics
        self.logger = logger
        self.max_inflight = max_inflight
        self.cancellation_poll_s = cancellation_poll_s
        self.drain_timeout_s = drain_timeout_s
        self.on_engine_failure = on_engine_failure
        self.shutdown_watch = shutdown_watch
        self.shutdown_poll_s = shutdown_poll_s
        self.stream_policy = stream_policy or StreamPolicy()
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
        # Send jobs of requests' first responses, run before the next job of _jobs.
        self._first: deque[Callable[[], None]] = deque()
        self._response_threads = [
            threading.Thread(target=self._run_jobs, name=f"tritonforge-responses-{i}", daemon=True)
            for i in range(response_threads or self.stream_policy.threads)
        ]
        self._metrics_lock = threading.Lock()  # the metrics sink is not thread-safe
        self._queued = 0  # jobs posted and not finished yet
        self._idle = threading.Condition()

    # --- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Start the loop and the engine; raises the engine's start-up error."""
        self._loop_thread.start()
        for thread in self._response_threads:
            thread.start()
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
        if self.tracer is not None:
            self.tracer.shutdown()  # the last requests' spans leave too
        self.logger.log_info("[tritonforge] stopped")

    def _stop_threads(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(timeout=30)
        # A send job may post its request's next one: wait until none is left (bounded),
        # so every request's FINAL goes out before the threads end.
        with self._idle:
            self._idle.wait_for(lambda: self._queued == 0, timeout=30)
        for _ in self._response_threads:
            self._jobs.put(None)
        for thread in self._response_threads:
            thread.join(timeout=30)

    async def _shutdown(self) -> None:
        self._watcher.cancel()
        tasks = [entry.task for entry in self._inflight.values() if entry.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.engine.shutdown()

    # --- request path ----------------------------------------------------------

    def submit(
        self,
        request: GenerateRequest,
        channel: Channel,
        triton_timeout_s: float | None = None,
        request_id: str = "",
        traceparent: str | None = None,
    ) -> None:
        """Hand a parsed request to the engine loop (called on Triton's thread).

        The prompt is prepared here so that its errors are answered from ``execute()``
        itself: an error response sent later, from another thread, never completes
        for a BLS caller in python backend 24.10 and wedges the caller's unload.
        ``triton_timeout_s`` is Triton's own request timeout when the client set one;
        the request's deadline is the smaller of it and ``timeout_s``, counted from here.
        Triton 2.51 workaround W2, see docs/triton-2.51-workarounds.md.

        ``request_id`` is the client's id for the request (one is made if it has none):
        the engine's id for it, and the one its logs, errors and trace carry; one
        already in flight is refused (:class:`DuplicateRequestId`). ``traceparent``
        is the caller's trace context, the parent of the request's spans when traced.
        """
        request_id = request_id or new_request_id()
        trace = None if self.tracer is None else self.tracer.begin(request_id, request, traceparent)
        try:
            if trace is None:  # tracing off, or not sampled
                self._submit(request, channel, triton_timeout_s, request_id, None)
            else:
                self._submit(request, trace.channel(channel), triton_timeout_s, request_id, trace)
        except BaseException as exc:
            if trace is not None:
                trace.refused(exc)
            if self.log_requests:
                self._log_request(request_id, trace, "refused")
            raise

    def _submit(
        self,
        request: GenerateRequest,
        channel: Channel,
        triton_timeout_s: float | None,
        request_id: str,
        trace: RequestTrace | None,
    ) -> None:
        if self.admission is not None:  # the TPOT rule needs no prompt: refuse before it
            self.admission.screen(request.sampling)
        prepared = self.engine.prepare(request)
        with self._lock:
            if self._failure is not None:
                raise self._failure_error()
            if self._closing:
                raise EngineUnavailable("the model is unloading; no new requests are accepted")
            if len(self._inflight) >= self.max_inflight:
                raise EngineBusy.at_bound("model", self.max_inflight)
            if request_id in self._inflight:
                raise DuplicateRequestId(request_id)
            if self.admission is not None:  # raises SloUnattainable: refused at once
                admitting = time.perf_counter()
                self.admission.admit(request_id, len(prepared.token_ids), request.sampling)
                if trace is not None:
                    trace.admitted(
                        admission_decision(request),
                        self.admission.predicted_ttft_s(request_id),
                        admitting,
                        time.perf_counter(),
                    )
            deadline = Deadline.tightest(request.sampling.timeout_s, triton_timeout_s)
            entry = _Inflight(request_id, channel, Outbox(self.stream_policy), deadline)
            entry.trace = trace
            self._inflight[request_id] = entry
        self._loop.call_soon_threadsafe(self._begin, request_id, request, prepared, entry)

    def run_on_loop(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``work`` on the engine's loop (from any thread), beside the requests.

        For work that is not a request but must reach the running engine where its
        requests run (loading a LoRA adapter): the caller is answered from the future.
        """
        return asyncio.run_coroutine_threadsafe(work, self._loop)

    def _begin(
        self, request_id: str, request: GenerateRequest, prepared: PreparedPrompt, entry: _Inflight
    ) -> None:
        entry.task = self._loop.create_task(self._serve(request_id, request, prepared, entry))

    def _post(self, job: Callable[[], None], first: bool = False) -> None:
        """Queue ``job`` for a response thread; a ``first`` response's job goes ahead.

        Under load every request in flight has a send job queued, and a new request's
        first token would wait behind all of them. A first job goes into its own lane,
        and a wake-up into the common queue so that an idle thread picks it at once.
        """
        with self._idle:
            self._queued += 1
        if first:
            self._first.append(job)
            job = _wake_up
        self._jobs.put(job)

    def _post_send(self, entry: _Inflight, posted: bool) -> None:
        """Post the request's send job if its outbox asked for one (``posted``)."""
        first, entry.started = not entry.started, True
        if posted:
            self._post(functools.partial(self._flush, entry), first)

    def _send(
        self,
        entry: _Inflight,
        output: EngineOutput | None,
        error: BaseException | None,
        final: bool,
    ) -> None:
        """Hand one output (or the request's end) to its outbox (only ever called on the loop).

        The FINAL response carries the request's metrics record in the same job, counted
        just before the response leaves: a client holding its answer (a test, a canary
        reading the counters) never sees the counters lag behind it.
        """
        if entry.closed:
            return
        if not final:
            assert output is not None
            self._post_send(entry, entry.outbox.put(output))
            return
        entry.closed = True
        record = None
        if entry.timing is not None:
            outcome = "finished" if error is None else "cancelled" if entry.cancelled else "failed"
            record = entry.timing.record(outcome)
        self._post_send(entry, entry.outbox.finish(Final(output, error, record)))

    def _flush(self, entry: _Inflight) -> None:
        """One send job of one request (a response thread): poll, send, end, in order.

        Only one job per request exists at a time (its outbox says when to post the
        next), so a request's responses never overtake each other on the threads. A job
        sends what keeps arriving for a few rounds before it queues behind the others:
        handing a request to another thread costs a wake-up per response.
        """
        outbox = entry.outbox
        more = True
        try:
            for _ in range(SENDS_PER_JOB):
                batch = outbox.take()
                if batch.poll:
                    self._check_cancelled(entry)
                if batch.output is not None:
                    self._send_output(entry, batch.output, batch.final)
                if batch.final is not None:
                    self._end(entry, batch.final)
                if not (more := outbox.release()):
                    return
        finally:
            if more and outbox.release():
                self._post(functools.partial(self._flush, entry))

    def _send_output(self, entry: _Inflight, output: EngineOutput, final: Final | None) -> None:
        """Send one non-final response; if the sender refuses it, the request still ends.

        An error FINAL (cancelled, past its deadline, the server stopping) can share its
        job with the output that was waiting before it. Were the FINAL skipped when
        that output is refused, its caller would wait for it for good: a client's stream
        never ends, and an ensemble counts the request in flight until the server's exit
        timeout. So the FINAL goes first, then the error is raised for the job loop's log.
        """
        try:
            entry.channel.send(self._tensors(entry, output), None, False)
        except Exception:
            if final is not None:
                self._end(entry, final)
            raise

    def _end(self, entry: _Inflight, final: Final) -> None:
        """Count the request, then send its FINAL response (even if counting fails)."""
        try:
            if isinstance(final.record, RequestRecord):
                with self._metrics_lock:
                    self.metrics.record(final.record)
        finally:  # a metrics failure is logged by the job loop; the response still goes
            tensors = None if final.output is None else self._tensors(entry, final.output)
            entry.channel.send(tensors, final.error, True)
            if entry.trace is not None:
                self._end_trace(entry, entry.trace, final)
            if self.log_requests:
                record = final.record if isinstance(final.record, RequestRecord) else None
                outcome = "failed" if record is None else record.outcome  # None: before the engine
                self._log_request(entry.request_id, entry.trace, outcome, record)

    def _log_request(
        self,
        request_id: str,
        trace: RequestTrace | None,
        outcome: str,
        record: RequestRecord | None = None,
    ) -> None:
        """The request's line (request_log.py), once it has ended."""
        trace_id = None if trace is None else trace.root.trace_id
        self.logger.log_info(f"[tritonforge] {request_line(request_id, outcome, record, trace_id)}")

    @staticmethod
    def _end_trace(entry: _Inflight, trace: RequestTrace, final: Final) -> None:
        """Build a traced request's spans from what its metrics recorded."""
        timing = entry.timing
        record = final.record if isinstance(final.record, RequestRecord) else None
        trace.end(
            timing.started if timing is not None else None,
            timing.first_token_at if timing is not None else None,
            timing.last_token_at if timing is not None and timing.generated else None,
            timing.prompt_tokens if timing is not None else None,
            timing.generated if timing is not None else 0,
            final.output,
            final.error,
            record.outcome if record is not None else "failed",
        )

    @staticmethod
    def _tensors(entry: _Inflight, output: EngineOutput) -> dict[str, npt.NDArray[Any]]:
        assert entry.build is not None, "an output before the request was served"
        return entry.build(output)

    async def _serve(
        self, request_id: str, request: GenerateRequest, prepared: PreparedPrompt, entry: _Inflight
    ) -> None:
        """One request from first delta to its single FINAL response and metrics record."""
        timing = entry.timing = _Timing(
            len(prepared.token_ids), request.sampling.lora_name, request.sampling.n
        )
        returns, prompt_tokens = request.returns, timing.prompt_tokens
        echo = request.prepend_input and not request.stream
        prefix = prepared.text if echo and prepared.text else ""

        def build(output: EngineOutput) -> dict[str, npt.NDArray[Any]]:
            return build_outputs(output, returns, prompt_tokens, prefix)

        entry.build = build
        try:
            await self._consume(request_id, request, prepared, entry, timing)
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
            elif isinstance(exc, self.engine.refusals) and timing.generated == 0:
                # The engine refused the request as it took it: the client's to fix.
                self._send(entry, None, engine_refusal(exc, SAMPLING_KEYS), True)
            else:
                self.logger.log_error(f"[tritonforge] request {request_id} failed: {exc!r}")
                self._send(entry, None, exc, True)
        finally:
            with self._lock:
                self._inflight.pop(request_id, None)
            if self.admission is not None:
                self.admission.release(request_id)
            # Every path above sent the FINAL; this only guards the one-FINAL rule.
            self._send(entry, None, EngineUnavailable("the request ended without an answer"), True)

    async def _consume(
        self,
        request_id: str,
        request: GenerateRequest,
        prepared: PreparedPrompt,
        entry: _Inflight,
        timing: _Timing,
    ) -> None:
        """The engine's deltas into the request's stream or aggregate until the engine
        finishes, the client cancels or the deadline passes.

        Each delta is taken where the engine delivers it (:meth:`Engine.push`), on the
        loop, without waking this task. The deadline bounds the whole wait, not just
        the gaps between deltas, so a request ends on time whatever the engine is doing
        with it (queued behind others, evaluating a long prompt); expiry cancels the
        wait inside the engine, which releases the request, and the caller aborts it.
        """
        if self._failure is not None:  # failed between submit() and now
            raise self._failure_error()
        send = functools.partial(self._send, entry)
        taker: _Streamed | _Aggregated | _Choices
        if request.sampling.n > 1:
            taker = _Choices(send, request.sampling.n, request.stream)
        elif request.stream:
            taker = _Streamed(send)
        else:
            taker = _Aggregated(send)
        admission = self.admission

        def take(delta: EngineOutput) -> bool:
            if entry.cancelled:
                return False
            timing.saw(delta)
            if admission is not None:
                admission.saw_tokens(request_id, len(delta.token_ids))
            taker.take(delta)
            return True

        if entry.trace is not None:  # an engine that traces itself joins the trace
            entry.trace.enter_engine()
        work = self.engine.push(request_id, prepared, request.sampling, take)
        deadline = entry.deadline
        if deadline is None:
            await work
        else:
            expiry = asyncio.timeout(deadline.at - time.monotonic())
            try:
                async with expiry:
                    await work
            except TimeoutError:
                if not expiry.expired():
                    raise  # the engine's own TimeoutError: a failure like any other
                raise DeadlineExceeded(deadline.seconds, deadline.source) from None
        if not entry.cancelled:
            taker.close()

    async def _abort_quietly(self, request_id: str) -> None:
        with contextlib.suppress(Exception):
            await self.engine.abort(request_id)

    # --- cancellation and gauges ------------------------------------------------

    async def _watch(self) -> None:
        """Every poll interval: cancelled clients, the engine's health, the gauges."""
        next_server_poll = 0.0
        while True:
            await asyncio.sleep(self.cancellation_poll_s)
            self._request_polls()
            if self._failure is None and (cause := self.engine.failure()) is not None:
                self._engine_failed(cause)
            # Every turn until the server's endpoint first answered: a SIGTERM right after
            # the model became ready must not fall before the watch is armed.
            watch = self.shutdown_watch
            if watch is not None and (time.monotonic() >= next_server_poll or not watch.armed):
                next_server_poll = time.monotonic() + self.shutdown_poll_s
                await self._watch_server(watch)
            stats = self.engine.stats()
            if not self._inflight:
                # The engine cannot be busy with requests we no longer have; its last
                # stats snapshot may predate the step that finished them.
                stats = EngineStats(0, 0, stats.kv_cache_usage, max_lora=stats.max_lora)
            stats = self._with_adapters(stats)
            self._post(functools.partial(self._set_stats, stats))

    def _with_adapters(self, stats: EngineStats) -> EngineStats:
        """The adapters in flight, for the endpoint picker's LoRA affinity.

        Engine-agnostic: a request that has produced a token is running on its adapter,
        one that has not (queued or in prefill) waits for it.
        """
        running: set[str] = set()
        waiting: set[str] = set()
        with self._lock:
            inflight = list(self._inflight.values())
        for entry in inflight:
            timing = entry.timing
            if timing is not None and timing.lora is not None:
                (running if timing.first_token_at is not None else waiting).add(timing.lora)
        return dataclasses.replace(
            stats, running_loras=tuple(sorted(running)), waiting_loras=tuple(sorted(waiting))
        )

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
        if self.admission is not None:
            self.admission.reset()  # the engine that comes back is calibrated afresh
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

    def _request_polls(self) -> None:
        """On the loop: every request in flight checks for its cancellation once.

        The check rides with the request's next send job (one is posted if none is
        queued), so it never races that request's FINAL and costs no job of its own
        while the request is streaming.
        """
        with self._lock:
            inflight = list(self._inflight.values())
        for entry in inflight:
            if not entry.cancelled and entry.outbox.poll():
                self._post(functools.partial(self._flush, entry))

    def _check_cancelled(self, entry: _Inflight) -> None:
        """On a response thread: is_cancelled() is an IPC round trip."""
        try:
            cancelled = entry.channel.is_cancelled()
        except Exception:
            cancelled = True
        if cancelled:
            self._loop.call_soon_threadsafe(self._cancel, entry.request_id, entry)

    def _set_stats(self, stats: EngineStats) -> None:
        with self._metrics_lock:
            self.metrics.set_stats(stats)
            if self.admission is not None:
                self.admission.export()

    def _cancel(self, request_id: str, entry: _Inflight) -> None:
        entry.cancelled = True
        self._loop.create_task(self._abort_quietly(request_id))

    def _run_jobs(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                self._run_first_jobs()
                self._run(job)
            finally:
                with self._idle:
                    self._queued -= 1
                    if self._queued == 0:
                        self._idle.notify_all()

    def _run_first_jobs(self) -> None:
        """Run the first responses' jobs waiting (each once: the lane's pop is atomic)."""
        while True:
            try:
                job = self._first.popleft()
            except IndexError:
                return
            self._run(job)

    def _run(self, job: Callable[[], None]) -> None:
        """One job on a response thread; its failure is logged, the thread goes on."""
        try:
            job()
        except Exception as exc:
            self.logger.log_error(f"[tritonforge] response thread: {exc!r}")


def admission_decision(request: GenerateRequest) -> str:
    """The admission counter's label for a request admission let in."""
    sampling = request.sampling
    return NO_SLO if sampling.slo_ttft_ms is None and sampling.slo_tpot_ms is None else ADMITTED


def _wake_up() -> None:
    """The common queue's stand-in for a first response's job (run from its own lane)."""


#: Sends one output (or none), an error (or none), and whether it is the FINAL.
_Send = Callable[[EngineOutput | None, BaseException | None, bool], None]


class _Streamed:
    """A streamed request's deltas into responses: one per delta that completes text
    (fewer when coalesced), the FINAL last.

    Tokens whose text is not complete yet (half a UTF-8 character, a possible stop
    string) ride with the response that completes it, so each response's output_ids
    decode to exactly its text_output. A stateless detokenizer downstream (the
    ensemble's postprocessing) then streams exact text without keeping per-request state.
    """

    __slots__ = ("_finished", "_held", "_send")

    def __init__(self, send: _Send) -> None:
        self._send = send
        self._held: EngineOutput | None = None
        self._finished = False

    def take(self, delta: EngineOutput) -> None:
        self._finished = delta.finished
        held = self._held = merge_outputs(self._held, delta)
        if held.text or self._finished:
            self._send(held, None, self._finished)
            self._held = None

    def close(self) -> None:
        if self._held is not None:  # the engine stopped mid-character: flush, close
            self._send(self._held, None, True)
        elif not self._finished:  # the engine stopped without a final delta: close
            self._send(None, None, True)


class _Aggregated:
    """A non-streamed request: one response with the whole generation (the prompt
    first, when echoed)."""

    __slots__ = ("_generation", "_send")

    def __init__(self, send: _Send) -> None:
        self._send = send
        self._generation = Generation()

    def take(self, delta: EngineOutput) -> None:
        self._generation.add(delta)

    def close(self) -> None:
        self._send(self._generation.as_output(), None, True)


class _Choices:
    """A request for n > 1 sequences of one prompt: each response carries all n, in
    index order (vllm_backend's shape); the request ends once every sequence has.

    Streamed, a response carries what each sequence added since the last one (empty
    for a sequence that added nothing); a delta without text waits for the next one,
    unless it ends its sequence. Not streamed, one response carries the n whole texts.
    """

    __slots__ = ("_done", "_held", "_send", "_stream", "_whole")

    def __init__(self, send: _Send, n: int, stream: bool) -> None:
        self._send = send
        self._stream = stream
        self._whole = [Generation() for _ in range(n)]
        self._held: EngineOutput | None = None
        self._done = [False] * n

    def _blank(self) -> EngineOutput:
        return EngineOutput(choices=[EngineOutput(index=i) for i in range(len(self._done))])

    def take(self, delta: EngineOutput) -> None:
        index = delta.index
        if not 0 <= index < len(self._done):
            raise RuntimeError(f"the engine sent sequence {index} of {len(self._done)}")
        self._done[index] = self._done[index] or delta.finished
        if not self._stream:
            self._whole[index].add(delta)
            return
        update = self._blank()
        assert update.choices is not None
        update.choices[index] = delta
        finished = all(self._done)
        update.finished = finished
        held = self._held = merge_outputs(self._held, update)
        if delta.text or delta.finished:
            self._send(held, None, finished)
            self._held = None

    def close(self) -> None:
        if not self._stream:
            whole = [generation.as_output() for generation in self._whole]
            self._send(EngineOutput(choices=whole, finished=True), None, True)
        elif self._held is not None:
            self._send(self._held, None, True)
        elif not all(self._done):  # the engine stopped without every sequence's end
            self._send(None, None, True)
