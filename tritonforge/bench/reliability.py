"""Reliability scenarios: sustained mixed load, a cancellation storm, SIGTERM.

Each scenario is one function that drives a running tritonserver from 127.0.0.1 and
returns a :class:`Scenario`: a pass/fail verdict, the criteria it was judged by and the
figures it measured. ``make soak`` runs them at full size (``tritonforge.bench.soak``),
``tests/e2e/test_reliability.py`` runs them small against the test session's server;
both call the same functions, so the CI check and the committed figures measure the same
thing. The malformed-input storm lives in :mod:`tritonforge.bench.malformed` (it is the
only part that needs hypothesis).

The clients are asyncio: 64 or 100 concurrent requests from threads would cost the
two cores more than the server they are measuring. gRPC requests go through
``grpc.aio`` with tritonclient's protobuf messages rather than
``tritonclient.grpc.aio``, whose stream API cannot ask for the empty FINAL response
(``triton_enable_empty_final_response`` is a reserved parameter there): without it an
ensemble's end of stream is never seen, and "the request ended" is exactly what these
scenarios check. Every wait is bounded; a request that outlives its bound is counted
as hung, never waited for forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import signal
import struct
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import grpc
import numpy as np
import psutil
from pydantic import BaseModel
from tritonclient.grpc import InferResult, service_pb2, service_pb2_grpc

LLM = "vllm_model"
ENSEMBLE = "ensemble_vllm"
#: Models each served model needs loaded beside it.
NEEDS = {ENSEMBLE: (LLM, "preprocessing", "postprocessing")}
PROMPTS = (
    "Write a short note to a colleague about the planning meeting on Thursday.",
    "Explain in two sentences why the sky is blue.",
    "List three things to pack for a weekend hiking trip.",
    "Once upon a time, in a small village by the sea,",
    "Describe the taste of a fresh orange to someone who has never had one.",
    "What are the advantages of learning a second language?",
    "Summarise the plot of a detective story in one paragraph.",
    "Give a recipe idea that uses rice, eggs and spinach.",
)
#: Structured outputs the mixed load asks for, each with the check its text must pass
#: when generation stopped by itself: a constraint the engine ignored shows as a failed
#: request. A text cut by max_tokens (finish_reason "length") cannot be complete JSON and
#: is counted apart, not failed: vLLM's JSON grammar allows any whitespace between
#: tokens, and a small model can spend its budget on newlines (vLLM 0.32 does not read
#: the per-request ``disable_any_whitespace``, only the engine-wide setting).
STRUCTURED: tuple[tuple[str, dict[str, Any], int, Callable[[str], bool]], ...] = (
    ("choice", {"choice": ["yes", "no", "maybe"]}, 4, lambda t: t in ("yes", "no", "maybe")),
    ("regex", {"regex": "[0-9]{3}"}, 8, lambda t: re.fullmatch("[0-9]{3}", t) is not None),
    (
        "json",
        {
            "json": {
                "type": "object",
                "properties": {"ok": {"type": "boolean"}},
                "required": ["ok"],
                "additionalProperties": False,
            },
            "disable_any_whitespace": True,
        },
        32,
        lambda t: isinstance(_json_or_none(t), dict) and isinstance(_json_or_none(t)["ok"], bool),
    ),
)
KINDS = ("grpc_stream", "grpc_single", "http_generate", "http_stream", "structured")
REQUEST_TIMEOUT_S = 300.0


def _json_or_none(text: str) -> Any:
    with contextlib.suppress(ValueError):
        return json.loads(text)
    return None


class Scenario(BaseModel):
    """One scenario's verdict: what had to hold, whether it did, and what was measured."""

    name: str
    passed: bool
    criteria: list[str]
    figures: dict[str, Any]
    failures: list[str] = []  # what broke a criterion (the first few instances)
    seconds: float = 0.0


class Server(Protocol):
    """What a scenario needs from a server: its addresses (a ``TritonServer``)."""

    @property
    def http_url(self) -> str: ...

    @property
    def grpc_url(self) -> str: ...

    @property
    def metrics_url(self) -> str: ...


def models_to_load(models: Sequence[str]) -> list[str]:
    """The served models plus the steps an ensemble among them runs."""
    loaded: list[str] = []
    for model in models:
        for name in (*NEEDS.get(model, ()), model):
            if name not in loaded:
                loaded.append(name)
    return loaded


# --- metrics --------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)$")


def parse_metric(text: str, name: str, model: str | None = None) -> float:
    """Sum of one Prometheus series' samples (those labelled ``model`` when given)."""
    total = 0.0
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or match.group(1) != name:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if model is not None and labels.get("model") != model:
            continue
        total += float(match.group(3))
    return total


async def read_metrics(
    session: aiohttp.ClientSession, server: Server, names: Sequence[str], model: str = LLM
) -> dict[str, float]:
    async with session.get(server.metrics_url, timeout=aiohttp.ClientTimeout(10)) as reply:
        text = await reply.text()
    return {name: parse_metric(text, name, model) for name in names}


# --- the server's memory --------------------------------------------------------


def tree_rss(processes: Sequence[psutil.Process]) -> tuple[int, int]:
    """(summed RSS in bytes, live process count) over the server's process group.

    RSS counts pages shared between processes once per process; the sum is still the
    right thing to watch for growth, since a leak in any process raises it.
    """
    total, alive = 0, 0
    for proc in processes:
        with contextlib.suppress(psutil.Error):
            total += proc.memory_info().rss
            alive += 1
    return total, alive


# --- one request ------------------------------------------------------------------


@dataclass
class Outcome:
    """How one request ended. ``hung``: no end within its bound (an error, too)."""

    kind: str
    model: str
    ok: bool
    seconds: float
    responses: int = 0
    text: str = ""
    error: str | None = None
    hung: bool = False
    ended_at: float = 0.0  # time.monotonic() when it ended
    finish_reason: str = ""  # when asked for (return_finish_reason)


def _bytes_raw(value: str | bytes) -> bytes:
    """One BYTES element in KServe v2 raw form: little-endian uint32 length, then bytes."""
    data = value.encode() if isinstance(value, str) else value
    return struct.pack("<I", len(data)) + data


def grpc_request(
    model: str, inputs: dict[str, str | bytes | bool], request_id: str = ""
) -> service_pb2.ModelInferRequest:
    """A ModelInferRequest of [1]-shaped BYTES/BOOL inputs that asks for the empty FINAL."""
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    for name, value in inputs.items():
        is_bool = isinstance(value, bool)
        request.inputs.append(
            service_pb2.ModelInferRequest.InferInputTensor(
                name=name, datatype="BOOL" if is_bool else "BYTES", shape=[1]
            )
        )
        raw = np.array([value], dtype=bool).tobytes() if is_bool else _bytes_raw(value)
        request.raw_input_contents.append(raw)
    request.parameters["triton_enable_empty_final_response"].bool_param = True
    return request


def _text_of(response: service_pb2.ModelInferResponse, name: str = "text_output") -> str:
    if not any(o.name == name for o in response.outputs):
        return ""
    array = InferResult(response).as_numpy(name)
    return b"".join(array.reshape(-1)).decode("utf-8", errors="replace")


class GrpcStream:
    """One request on its own ``ModelStreamInfer`` call, which can be cancelled at once.

    The request iterator stays open until the request ends, as tritonclient's streams
    do: half-closing right after the request would let the server end the call early.
    """

    def __init__(self, channel: grpc.aio.Channel, request: service_pb2.ModelInferRequest):
        self._done = asyncio.Event()
        self._request = request
        self.call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(
            self._requests()
        )
        self.first_response = asyncio.Event()

    async def _requests(self) -> AsyncIterator[service_pb2.ModelInferRequest]:
        yield self._request
        await self._done.wait()

    async def _close(self, polite: bool) -> None:
        """End the call: half-close and let the server finish it, or cancel it.

        A request that ended (FINAL or an error) is closed politely, as tritonclient's
        ``stop_stream()`` without ``cancel_requests`` does; only a hung or abandoned one
        is cancelled.
        """
        self._done.set()
        if polite:
            with contextlib.suppress(TimeoutError, grpc.aio.AioRpcError):
                async with asyncio.timeout(5):
                    async for _ in self.call:
                        pass
        self.call.cancel()  # a no-op once the server has ended the call

    async def run(
        self, kind: str, timeout_s: float = REQUEST_TIMEOUT_S, *, cancel_at_end: bool = False
    ) -> Outcome:
        """Read responses until FINAL or an error; bounded by ``timeout_s``.

        ``cancel_at_end`` cancels the call the moment the request ended instead of
        closing it politely: scripts/repro_cancel_after_final.py shows that this keeps
        ensemble_vllm from unloading (Triton 2.51).
        """
        start = time.monotonic()
        outcome = Outcome(kind, self._request.model_name, False, 0.0)
        parts: list[str] = []
        try:
            async with asyncio.timeout(timeout_s):
                async for message in self.call:
                    if message.error_message:
                        outcome.error = message.error_message
                        break
                    response = message.infer_response
                    if response.outputs:
                        outcome.responses += 1
                        parts.append(_text_of(response))
                        outcome.finish_reason = (
                            _text_of(response, "finish_reason") or outcome.finish_reason
                        )
                        self.first_response.set()
                    final = response.parameters.get("triton_final_response")
                    if final is not None and final.bool_param:
                        outcome.ok = True
                        break
                else:
                    outcome.error = "the stream ended without a FINAL response"
        except TimeoutError:
            outcome.hung = True
            outcome.error = f"no end within {timeout_s:.0f} s"
        except grpc.aio.AioRpcError as error:
            outcome.error = f"{error.code().name}: {error.details()}"
        except asyncio.CancelledError:
            outcome.error = "cancelled by the client"
            raise
        finally:
            ended = not outcome.hung and outcome.error != "cancelled by the client"
            await self._close(polite=ended and not cancel_at_end)
            outcome.ended_at = time.monotonic()
            outcome.seconds = outcome.ended_at - start
            outcome.text = "".join(parts)
        return outcome


async def http_generate(
    session: aiohttp.ClientSession,
    server: Server,
    model: str,
    body: dict[str, Any],
    *,
    stream: bool = False,
    kind: str = "http_generate",
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> Outcome:
    """POST /generate (one JSON answer) or /generate_stream (server-sent events)."""
    start = time.monotonic()
    outcome = Outcome(kind, model, False, 0.0)
    endpoint = "generate_stream" if stream else "generate"
    url = f"http://{server.http_url}/v2/models/{model}/{endpoint}"
    try:
        async with (
            asyncio.timeout(timeout_s),
            session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=None)) as reply,
        ):
            if not stream:
                answer = await reply.json(content_type=None)
                outcome.responses = 1
                if reply.status != 200 or "error" in answer:
                    outcome.error = f"HTTP {reply.status}: {answer.get('error', answer)}"
                else:
                    outcome.ok, outcome.text = True, answer.get("text_output", "")
            else:
                parts = []
                async for line in reply.content:
                    if not line.startswith(b"data: "):
                        continue
                    event = json.loads(line[6:])
                    outcome.responses += 1
                    if "error" in event:
                        outcome.error = f"HTTP {reply.status}: {event['error']}"
                        break
                    parts.append(event.get("text_output", ""))
                outcome.text = "".join(parts)
                if reply.status != 200 and outcome.error is None:
                    outcome.error = f"HTTP {reply.status}"
                outcome.ok = outcome.error is None
    except TimeoutError:
        outcome.hung = True
        outcome.error = f"no end within {timeout_s:.0f} s"
    except (aiohttp.ClientError, ValueError) as error:
        outcome.error = f"{type(error).__name__}: {error}"
    outcome.ended_at = time.monotonic()
    outcome.seconds = outcome.ended_at - start
    return outcome


# --- the mixed load ---------------------------------------------------------------


@dataclass
class Clients:
    """Shared connections: a few gRPC channels (streams spread over them) and one HTTP pool."""

    server: Server
    channels: list[grpc.aio.Channel]
    session: aiohttp.ClientSession
    _next: int = 0

    @classmethod
    def open(cls, server: Server, concurrency: int) -> Clients:
        count = max(1, (concurrency + 15) // 16)
        channels = [grpc.aio.insecure_channel(server.grpc_url) for _ in range(count)]
        connector = aiohttp.TCPConnector(limit=concurrency + 8)
        return cls(server, channels, aiohttp.ClientSession(connector=connector))

    def channel(self) -> grpc.aio.Channel:
        self._next += 1
        return self.channels[self._next % len(self.channels)]

    async def close(self) -> None:
        await self.session.close()
        for channel in self.channels:
            await channel.close()


def _sampling(rng: random.Random, max_tokens: int) -> dict[str, Any]:
    greedy = rng.random() < 0.5
    sampling: dict[str, Any] = {"max_tokens": max_tokens, "min_tokens": 1}
    sampling |= {"temperature": 0} if greedy else {"temperature": 0.8, "seed": rng.randrange(1000)}
    return sampling


async def one_mixed_request(
    clients: Clients, rng: random.Random, models: Sequence[str], serial: int
) -> Outcome:
    """One request of a randomly chosen kind and model (seeded: a run can be repeated)."""
    model = rng.choice(models)
    kind = rng.choice(KINDS)
    prompt = f"{serial}. {rng.choice(PROMPTS)}"
    sampling = _sampling(rng, rng.choice((16, 32, 48, 64)))
    if kind in ("grpc_stream", "grpc_single"):
        inputs: dict[str, str | bytes | bool] = {
            "text_input": prompt,
            "sampling_parameters": json.dumps(sampling),
            "stream": kind == "grpc_stream",
            "exclude_input_in_output": True,
        }
        if model == LLM and rng.random() < 0.3:  # chat form, vllm_model only
            del inputs["text_input"]
            inputs["messages"] = json.dumps([{"role": "user", "content": prompt}])
        stream = GrpcStream(clients.channel(), grpc_request(model, inputs))
        return await stream.run(kind)
    if kind in ("http_generate", "http_stream"):
        body = {
            "text_input": prompt,
            "sampling_parameters": json.dumps(sampling),
            "exclude_input_in_output": True,
        }
        if kind == "http_stream":
            body["stream"] = True
        return await http_generate(
            clients.session, clients.server, model, body, stream=kind == "http_stream", kind=kind
        )
    name, constraint, max_tokens, check = rng.choice(STRUCTURED)
    sampling = _sampling(rng, max_tokens) | {"structured_outputs": constraint}
    inputs = {
        "text_input": f"{prompt} Answer:",
        "sampling_parameters": json.dumps(sampling),
        "stream": rng.random() < 0.5,
        "exclude_input_in_output": True,
        "return_finish_reason": True,
    }
    outcome = await GrpcStream(clients.channel(), grpc_request(model, inputs)).run(kind)
    if outcome.ok and outcome.finish_reason == "length":
        outcome.kind = "structured_cut_by_max_tokens"
    elif outcome.ok and not check(outcome.text.strip()):
        outcome.ok = False
        outcome.error = (
            f"structured output ({name}) violated, finish_reason {outcome.finish_reason!r}: "
            f"{outcome.text[:80]!r}"
        )
    return outcome


def _summarise(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    by_kind: dict[str, dict[str, int]] = {}
    for o in outcomes:
        entry = by_kind.setdefault(f"{o.model}/{o.kind}", {"ok": 0, "failed": 0})
        entry["ok" if o.ok else "failed"] += 1
    latencies = sorted(o.seconds for o in outcomes if o.ok)

    def pct(q: float) -> float | None:
        return round(latencies[int(q * (len(latencies) - 1))], 3) if latencies else None

    return {
        "requests": len(outcomes),
        "succeeded": sum(o.ok for o in outcomes),
        "failed": sum(not o.ok for o in outcomes),
        "hung": sum(o.hung for o in outcomes),
        "empty_texts": sum(o.ok and not o.text for o in outcomes),
        "by_model_and_kind": dict(sorted(by_kind.items())),
        "latency_s_p50": pct(0.5),
        "latency_s_p99": pct(0.99),
        "latency_s_max": round(latencies[-1], 3) if latencies else None,
    }


async def mixed_load(
    server: Server,
    *,
    models: Sequence[str] = (LLM, ENSEMBLE),
    concurrency: int = 64,
    duration_s: float = 300.0,
    warmup_s: float = 60.0,
    rss_limit_pct: float | None = 5.0,
    processes: Callable[[], list[psutil.Process]] | None = None,
    rss_interval_s: float = 5.0,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> Scenario:
    """``concurrency`` workers send mixed requests back to back for ``duration_s``.

    Passes when no request failed (errors, broken constraints and hangs all count) and,
    with ``rss_limit_pct`` and ``processes`` given, when the server process group's RSS
    grew less than that between the end of the warm-up and the end of the load. Both
    RSS points are taken under full load, so they compare like with like; the warm-up
    lets the engine touch its KV cache and the allocators settle first.
    """
    started = time.monotonic()
    end = started + duration_s
    clients = Clients.open(server, concurrency)
    outcomes: list[Outcome] = []
    rss: list[tuple[float, int, int]] = []  # (seconds since start, bytes, processes)
    serial = iter(range(10**9))

    async def worker(index: int) -> None:
        rng = random.Random(seed * 1_000_003 + index)
        while time.monotonic() < end:
            outcomes.append(await one_mixed_request(clients, rng, models, next(serial)))

    async def sample_rss() -> None:
        last_report = 0.0
        while True:
            now = time.monotonic() - started
            if processes is not None and (found := processes()):
                rss.append((round(now, 1), *tree_rss(found)))
            if progress is not None and now - last_report >= 30:
                last_report = now
                failed = sum(not o.ok for o in outcomes)
                memory = f", server RSS {rss[-1][1] / 2**30:.2f} GiB" if rss else ""
                progress(f"{now:5.0f} s: {len(outcomes)} requests, {failed} failed{memory}")
            await asyncio.sleep(rss_interval_s)

    sampler = asyncio.create_task(sample_rss())
    try:
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        await clients.close()

    figures = _summarise(outcomes) | {
        "models": list(models),
        "concurrency": concurrency,
        "duration_s": duration_s,
        "warmup_s": warmup_s,
        "wall_s": round(time.monotonic() - started, 1),
        "seed": seed,
    }
    figures["requests_per_s"] = round(figures["requests"] / figures["wall_s"], 2)
    criteria = ["0 requests failed (errors, constraint violations, hangs)"]
    passed = figures["failed"] == 0
    if rss:
        under_load = [s for s in rss if s[0] <= duration_s]
        warm = next((s for s in under_load if s[0] >= warmup_s), under_load[-1])
        last = under_load[-1]
        growth = 100.0 * (last[1] - warm[1]) / warm[1]
        figures |= {
            "rss_after_warmup_bytes": warm[1],
            "rss_at_end_bytes": last[1],
            "rss_growth_pct": round(growth, 2),
            "rss_window_s": [warm[0], last[0]],
            "server_processes": last[2],
            "rss_samples": rss,
        }
        if rss_limit_pct is not None:
            criteria.append(f"server process-group RSS growth < {rss_limit_pct:g} % after warm-up")
            passed = passed and growth < rss_limit_pct and last[0] > warm[0]
    failures = [f"{o.model}/{o.kind}: {o.error}" for o in outcomes if not o.ok][:10]
    return Scenario(
        name="mixed_load",
        passed=passed,
        criteria=criteria,
        figures=figures,
        failures=failures,
        seconds=round(time.monotonic() - started, 1),
    )


# --- cancellation storm -------------------------------------------------------------

GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


async def _wait_metrics(
    session: aiohttp.ClientSession,
    server: Server,
    predicate: Callable[[dict[str, float]], bool],
    timeout_s: float,
    interval_s: float = 0.05,
) -> tuple[float | None, dict[str, float]]:
    """Seconds until ``predicate(metrics)`` held (None: not within ``timeout_s``)."""
    start = time.monotonic()
    names = (*GAUGES, "vllm:request_outcome_total")
    while True:
        values = await read_metrics(session, server, names)
        if predicate(values):
            return time.monotonic() - start, values
        if time.monotonic() - start > timeout_s:
            return None, values
        await asyncio.sleep(interval_s)


async def _cancelled_total(session: aiohttp.ClientSession, server: Server) -> float:
    async with session.get(server.metrics_url, timeout=aiohttp.ClientTimeout(10)) as reply:
        text = await reply.text()
    return sum(
        float(m.group(3))
        for line in text.splitlines()
        if (m := _SAMPLE.match(line))
        and m.group(1) == "vllm:request_outcome_total"
        and f'model="{LLM}"' in (m.group(2) or "")
        and 'outcome="cancelled"' in (m.group(2) or "")
    )


async def cancel_storm(
    server: Server,
    *,
    streams: int = 100,
    model: str = LLM,
    within_s: float = 2.0,
    kv_within_s: float = 5.0,
) -> Scenario:
    """``streams`` long gRPC streams, all in the engine, cancelled at the same instant.

    Passes when the engine's running and waiting gauges are both 0 within ``within_s``
    of the cancel, the KV-cache gauge is back to its idle baseline within ``kv_within_s``,
    and every stream counts as cancelled in ``request_outcome_total``.
    """
    started = time.monotonic()
    session = aiohttp.ClientSession()
    channels = [grpc.aio.insecure_channel(server.grpc_url) for _ in range((streams + 24) // 25)]
    calls: list[GrpcStream] = []
    tasks: list[asyncio.Task] = []
    figures: dict[str, Any] = {"streams": streams, "model": model}
    failures: list[str] = []
    try:
        idle_after, idle = await _wait_metrics(
            session, server, lambda m: m[GAUGES[0]] == 0 and m[GAUGES[1]] == 0, 120
        )
        if idle_after is None:
            failures.append(f"the engine was not idle before the storm: {idle}")
        baseline_kv = idle[GAUGES[2]]
        cancelled_before = await _cancelled_total(session, server)
        sampling = {"max_tokens": 512, "ignore_eos": True, "temperature": 0.8}
        for i in range(streams):
            inputs: dict[str, str | bytes | bool] = {
                "text_input": f"Story {i}: {PROMPTS[i % len(PROMPTS)]}",
                "sampling_parameters": json.dumps(sampling | {"seed": i}),
                "stream": True,
            }
            calls.append(GrpcStream(channels[i % len(channels)], grpc_request(model, inputs)))
        tasks = [asyncio.create_task(c.run("cancelled_stream", timeout_s=180)) for c in calls]
        admitted_after, at_cancel = await _wait_metrics(
            session, server, lambda m: m[GAUGES[0]] + m[GAUGES[1]] >= streams, 120, 0.2
        )
        streaming = sum(c.first_response.is_set() for c in calls)
        if admitted_after is None:
            failures.append(f"only {at_cancel[GAUGES[0]] + at_cancel[GAUGES[1]]:.0f} in the engine")
        cancel_at = time.monotonic()
        for call in calls:
            call.call.cancel()
        idle_after, after = await _wait_metrics(
            session, server, lambda m: m[GAUGES[0]] == 0 and m[GAUGES[1]] == 0, 30
        )
        kv_after, kv = await _wait_metrics(
            session, server, lambda m: m[GAUGES[2]] <= baseline_kv + 1e-9, kv_within_s
        )
        kv_s = None if kv_after is None else time.monotonic() - cancel_at
        await asyncio.wait(tasks, timeout=30)
        ended = sum(t.done() for t in tasks)
        cancelled_after = await _cancelled_total(session, server)
        figures |= {
            "admitted_before_cancel_s": admitted_after and round(admitted_after, 2),
            "running_at_cancel": at_cancel[GAUGES[0]],
            "waiting_at_cancel": at_cancel[GAUGES[1]],
            "kv_usage_at_cancel": at_cancel[GAUGES[2]],
            "streams_with_output_at_cancel": streaming,
            "idle_after_cancel_s": idle_after and round(idle_after, 3),
            "kv_usage_baseline": baseline_kv,
            "kv_usage_after": kv[GAUGES[2]],
            "kv_back_after_s": kv_s and round(kv_s, 3),
            "client_calls_ended": ended,
            "counted_cancelled": cancelled_after - cancelled_before,
        }
        if idle_after is None or idle_after > within_s:
            failures.append(f"running/waiting not 0 within {within_s:g} s: {after}")
        if kv_s is None or kv_s > kv_within_s:
            failures.append(f"KV usage {kv[GAUGES[2]]} not back to {baseline_kv}")
        if cancelled_after - cancelled_before != streams:
            failures.append(f"{cancelled_after - cancelled_before:.0f} of {streams} counted")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await session.close()
        for channel in channels:
            await channel.close()
    return Scenario(
        name="cancel_storm",
        passed=not failures,
        criteria=[
            f"{streams} streams in the engine, cancelled at once",
            f"vllm:num_requests_running and _waiting back to 0 within {within_s:g} s",
            f"vllm:kv_cache_usage_perc back to its idle baseline within {kv_within_s:g} s",
            "every stream counted in request_outcome_total{outcome=cancelled}",
        ],
        figures=figures,
        failures=failures,
        seconds=round(time.monotonic() - started, 1),
    )


# --- SIGTERM under load -----------------------------------------------------------

_COUNTDOWN = re.compile(r"Timeout \d+: Found \d+ (HTTP service connections|live models)")


def shutdown_log(path: Any, limit: int = 40) -> list[str]:
    """The server log from its SIGTERM on, the once-a-second countdown lines folded."""
    if path is None:
        return []
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return []
    marker = text.rfind("Signal (15) received")
    if marker < 0:
        return []
    lines, folded = [], 0
    for line in text[marker:].splitlines():
        if _COUNTDOWN.search(line):
            folded += 1
            continue
        if folded:
            lines.append(f"[{folded} countdown lines]")
            folded = 0
        lines.append(line.strip()[:200])
    if folded:
        lines.append(f"[{folded} countdown lines]")
    return lines[:limit]


async def sigterm_under_load(
    server: Any,
    *,
    models: Sequence[str] = (LLM,),
    requests: int = 32,
    transports: Sequence[str] = ("grpc", "http"),
    max_tokens: int = 1024,
    exit_timeout_s: float = 30.0,
    margin_s: float = 30.0,
    orphan_grace_s: float = 10.0,
) -> Scenario:
    """SIGTERM to tritonserver itself with ``requests`` long requests in flight.

    ``server`` is a started :class:`tritonforge.launch.launcher.TritonServer`; this scenario
    ends it, as a process supervisor or a container runtime would (``make serve``'s
    launcher adds a SIGKILL of whatever is left; this measures what is left for it).
    The requests alternate between the models and between gRPC streams and HTTP
    ``/generate``; ``max_tokens`` (with ``ignore_eos``) makes them outlast the exit
    timeout on a CPU, so what is measured is the shutdown of a busy server, not one
    that happened to drain in time. Passes when every request ended — a response or
    an error — within the server's exit timeout plus ``margin_s`` of the signal (none
    hung), tritonserver exited in that time too, and no process of its session (stubs,
    engine cores) was alive ``orphan_grace_s`` after it. The caller still calls
    ``server.stop()``, which kills leftovers — after this function has counted them.
    """
    from tritonforge.launch.launcher import session_processes

    started = time.monotonic()
    clients = Clients.open(server, requests)
    rng = random.Random(15)
    leader = server.process.pid
    bound_s = exit_timeout_s + margin_s
    tasks: list[asyncio.Task] = []
    failures: list[str] = []
    figures: dict[str, Any] = {
        "requests": requests,
        "models": list(models),
        "transports": list(transports),
        "max_tokens": max_tokens,
        "exit_timeout_s": exit_timeout_s,
    }
    try:
        for i in range(requests):
            model = models[i % len(models)]
            sampling = {"max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.8, "seed": i}
            prompt = f"Story {i}: {rng.choice(PROMPTS)}"
            if transports[(i // len(models)) % len(transports)] == "http":
                body = {"text_input": prompt, "sampling_parameters": json.dumps(sampling)}
                coro = http_generate(clients.session, server, model, body, timeout_s=3600)
            else:
                inputs: dict[str, str | bytes | bool] = {
                    "text_input": prompt,
                    "sampling_parameters": json.dumps(sampling),
                    "stream": True,
                }
                stream = GrpcStream(clients.channel(), grpc_request(model, inputs))
                coro = stream.run("grpc_stream", timeout_s=3600)
            tasks.append(asyncio.create_task(coro))
        admitted_after, at_signal = await _wait_metrics(
            clients.session,
            server,
            lambda m: m[GAUGES[0]] + m[GAUGES[1]] >= requests,
            120,
            0.2,
        )
        figures["in_engine_at_sigterm"] = at_signal[GAUGES[0]] + at_signal[GAUGES[1]]
        figures["processes_before"] = len(server.group_processes())
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        exit_code: int | None = None
        with contextlib.suppress(Exception):  # subprocess.TimeoutExpired: still running
            exit_code = await asyncio.to_thread(server.process.wait, bound_s)
        exited_after = time.monotonic() - signalled
        done, pending = await asyncio.wait(
            tasks, timeout=max(0.1, bound_s - (time.monotonic() - signalled))
        )
        outcomes = [t.result() for t in done]
        answered = [o for o in outcomes if o.ok]
        errored = [o for o in outcomes if not o.ok]
        # Still running: its processes are trivially "left"; no grace to wait out.
        deadline = time.monotonic() + (orphan_grace_s if exit_code is not None else 0.0)
        left = session_processes(leader)
        while left and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            left = session_processes(leader)
        ends = sorted(o.ended_at - signalled for o in outcomes)
        figures |= {
            "answered": len(answered),
            "errored": len(errored),
            "hung": len(pending),
            "first_end_after_sigterm_s": round(ends[0], 2) if ends else None,
            "last_end_after_sigterm_s": round(ends[-1], 2) if ends else None,
            "error_samples": sorted({(o.error or "")[:160] for o in errored})[:5],
            "server_exit_code": exit_code,
            "server_exited_after_s": round(exited_after, 2) if exit_code is not None else None,
            "processes_left": [f"{p.pid} {_cmd(p)}" for p in left],
            "server_log_after_sigterm": shutdown_log(getattr(server, "log_path", None)),
        }
        if admitted_after is None:
            failures.append(f"the load never all reached the engine: {at_signal}")
        if pending:
            failures.append(
                f"{len(pending)} of {requests} request(s) had no response and no error "
                f"{bound_s:.0f} s after SIGTERM"
            )
        if exit_code is None:
            failures.append(f"tritonserver still running {bound_s:.0f} s after SIGTERM")
        if left and exit_code is not None:
            failures.append(
                f"{len(left)} process(es) of the server's group alive {orphan_grace_s:g} s "
                f"after it exited: {', '.join(_cmd(p)[:40] for p in left)}"
            )
        elif left:
            failures.append(
                f"{len(left)} process(es) of the server's group still running (tritonserver "
                f"too), left for the caller's SIGKILL: {', '.join(p.name() for p in left)}"
            )
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await clients.close()
    return Scenario(
        name="sigterm_under_load",
        passed=not failures,
        criteria=[
            f"{requests} long requests in flight (gRPC streams and HTTP /generate) at "
            "SIGTERM to tritonserver",
            f"each gets a response or an error within {bound_s:.0f} s of the signal "
            f"(exit timeout {exit_timeout_s:g} s + {margin_s:g} s)",
            f"tritonserver exits within {bound_s:.0f} s",
            f"no process of its group alive {orphan_grace_s:g} s after it exited",
        ],
        figures=figures,
        failures=failures,
        seconds=round(time.monotonic() - started, 1),
    )


def _cmd(proc: psutil.Process) -> str:
    with contextlib.suppress(psutil.Error):
        return " ".join(proc.cmdline()).strip()[:120] or proc.name()
    return "?"
