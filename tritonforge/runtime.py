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
too and answered with :class:`~tritonforge.errors.DeadlineExceeded`.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from tritonforge.engines.base import Engine, EngineOutput, EngineStats, PreparedPrompt
from tritonforge.errors import DeadlineExceeded, EngineBusy, EngineUnavailable, RequestError
from tritonforge.responses import Generation, build_outputs, merge_outputs
from tritonforge.schema import GenerateRequest


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
    ) -> None:
        self.engine = engine
        self.metrics = metrics
        self.logger = logger
        self.max_inflight = max_inflight
        self.cancellation_poll_s = cancellation_poll_s
        self.drain_timeout_s = drain_timeout_s
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
        """
        prepared = self.engine.prepare(request)
        with self._lock:
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
        self._post(lambda: entry.channel.send(tensors, error, final))

    async def _serve(
        self, request_id: str, request: GenerateRequest, prepared: PreparedPrompt, entry: _Inflight
    ) -> None:
        started = time.perf_counter()
        first_token_at: float | None = None
        prompt_tokens = generated = 0
        outcome = "failed"
        finished = False
        closed = False  # a streamed response carrying FINAL went out
        try:
            prompt_tokens = len(prepared.token_ids)
            prefix = prepared.text if request.prepend_input and prepared.text else ""
            generation = Generation()
            held: EngineOutput | None = None
            deltas = self.engine.generate(request_id, prepared, request.sampling)
            async for delta in _until(entry.deadline, deltas):
                if entry.cancelled:
                    break
                if delta.token_ids and first_token_at is None:
                    first_token_at = time.perf_counter()
                generated += len(delta.token_ids)
                finished = delta.finished
                if not request.stream:
                    generation.add(delta)
                    continue
                # Tokens whose text is not complete yet (half a UTF-8 character, a
                # possible stop string) ride with the response that completes it, so
                # each response's output_ids decode to exactly its text_output. A
                # stateless detokenizer downstream (the ensemble's postprocessing)
                # then streams exact text without keeping per-request state.
                held = merge_outputs(held, delta)
                if held.text or finished:
                    outputs = build_outputs(held, request.returns, prompt_tokens)
                    self._send(entry, outputs, None, finished)
                    closed = finished
                    held = None
            if entry.cancelled:
                outcome = "cancelled"
                self._send(entry, None, asyncio.CancelledError("request cancelled"), True)
            elif not request.stream:
                outputs = build_outputs(
                    generation.as_output(), request.returns, prompt_tokens, prefix
                )
                self._send(entry, outputs, None, True)
                outcome = "finished"
            else:
                if held is not None:  # the engine stopped mid-character: flush, close
                    outputs = build_outputs(held, request.returns, prompt_tokens)
                    self._send(entry, outputs, None, True)
                elif not finished:  # the engine stopped without a final delta: close
                    self._send(entry, None, None, True)
                outcome = "finished"
        except RequestError as exc:
            self._send(entry, None, exc, True)
        except DeadlineExceeded as exc:
            await self._abort_quietly(request_id)
            if not closed:  # responses already streamed stay sent; this one is FINAL
                self._send(entry, None, exc, True)
        except asyncio.CancelledError:
            await self._abort_quietly(request_id)
            self._send(entry, None, EngineUnavailable("the model was unloaded mid-request"), True)
            raise
        except Exception as exc:
            self.logger.log_error(f"[tritonforge] request failed: {exc!r}")
            await self._abort_quietly(request_id)
            self._send(entry, None, exc, True)
        finally:
            with self._lock:
                self._inflight.pop(request_id, None)
            ended = time.perf_counter()
            tpot = None
            if first_token_at is not None and generated > 1:
                tpot = (ended - first_token_at) / (generated - 1)
            record = RequestRecord(
                prompt_tokens=prompt_tokens,
                generation_tokens=generated,
                e2e_s=ended - started,
                ttft_s=None if first_token_at is None else first_token_at - started,
                tpot_s=tpot,
                outcome=outcome,
            )
            self._post(lambda: self.metrics.record(record))

    async def _abort_quietly(self, request_id: str) -> None:
        with contextlib.suppress(Exception):
            await self.engine.abort(request_id)

    # --- cancellation and gauges ------------------------------------------------

    async def _watch(self) -> None:
        """Every poll interval: check for cancelled clients and refresh the gauges."""
        while True:
            await asyncio.sleep(self.cancellation_poll_s)
            self._post(self._poll_cancellations)
            stats = self.engine.stats()
            if not self._inflight:
                # The engine cannot be busy with requests we no longer have; its last
                # stats snapshot may predate the step that finished them.
                stats = EngineStats(0, 0, stats.kv_cache_usage)
            self._post(lambda s=stats: self.metrics.set_stats(s))

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
