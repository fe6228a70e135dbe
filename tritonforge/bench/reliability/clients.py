"""The suite's clients: one request over gRPC or HTTP, bounded, and how it ended.

The clients are asyncio: 64 or 100 concurrent requests from threads would cost the
two cores more than the server they are measuring. gRPC requests go through
``grpc.aio`` with tritonclient's protobuf messages rather than
``tritonclient.grpc.aio``, whose stream API cannot ask for the empty FINAL response
(``triton_enable_empty_final_response`` is a reserved parameter there): without it an
ensemble's end of stream is never seen, and "the request ended" is exactly what the
scenarios check. Every wait is bounded; a request that outlives its bound is counted
as hung, never waited for forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import grpc
import numpy as np
from tritonclient.grpc import InferResult, service_pb2, service_pb2_grpc

REQUEST_TIMEOUT_S = 300.0


class Server(Protocol):
    """What a scenario needs from a server: its addresses (a ``TritonServer``)."""

    @property
    def http_url(self) -> str: ...

    @property
    def grpc_url(self) -> str: ...

    @property
    def metrics_url(self) -> str: ...


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
    #: time.monotonic() when the first part of the answer reached the client (None: none).
    first_at: float | None = None
    #: The client got a second answer, or a second beginning or end of one (a replay).
    duplicated: bool = False


def bytes_raw(value: str | bytes) -> bytes:
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
        if isinstance(value, bool):
            raw = np.array([value], dtype=bool).tobytes()
        else:
            raw = bytes_raw(value)
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


@dataclass
class Clients:
    """Shared connections: a few gRPC channels (streams spread over them) and one HTTP pool."""

    server: Server
    channels: list[grpc.aio.Channel]
    session: aiohttp.ClientSession
    _next: int = 0

    @classmethod
    def open(cls, server: Server, concurrency: int, per_channel: int = 16) -> Clients:
        count = max(1, -(-concurrency // per_channel))
        channels = [grpc.aio.insecure_channel(server.grpc_url) for _ in range(count)]
        connector = aiohttp.TCPConnector(limit=concurrency + 8)
        return cls(server, channels, aiohttp.ClientSession(connector=connector))

    def channel(self) -> grpc.aio.Channel:
        self._next += 1
        return self.channels[self._next % len(self.channels)]

    async def close(self, abandoned: Sequence[asyncio.Task[Any]] = ()) -> None:
        """Cancel the requests still running (``abandoned``), wait for them to end, close."""
        for task in abandoned:
            task.cancel()
        await asyncio.gather(*abandoned, return_exceptions=True)
        await self.session.close()
        for channel in self.channels:
            await channel.close()
