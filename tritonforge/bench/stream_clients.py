"""Lean asyncio streaming clients that count the tokens that arrive, for the serving ceiling.

The serving-ceiling contract measures the serving path itself, so the client must cost
as little as it can and count what the server really sent: tokens, not responses (one
response may carry several tokens). Each protocol has one client:

* ``grpc``: Triton's ``ModelStreamInfer`` with raw protobuf messages (no tritonclient
  result wrapping); tokens are each response's ``num_output_tokens``;
* ``http``: Triton's ``/v2/models/<m>/generate_stream`` (SSE); tokens are each event's
  ``num_output_tokens``;
* ``openai_chat`` / ``openai_completions``: the OpenAI frontend, streamed with
  ``stream_options.include_usage``; tokens are the final ``usage.completion_tokens`` and
  each chunk with text is one arrival.

A worker is one closed-loop slot: one request at a time, on a connection (gRPC stream,
HTTP keep-alive) of its own. Times are ``time.perf_counter`` seconds.
"""

from __future__ import annotations

import abc
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

PROTOCOLS = ("grpc", "http", "openai_chat", "openai_completions")


@dataclass
class StreamRecord:
    """One request as the client saw it."""

    start: float
    end: float = 0.0
    arrivals: list[float] = field(default_factory=list)  # each response that carried tokens
    tokens: int = 0
    first_tokens: int = 0  # what the first of them carried
    error: str | None = None

    def arrived(self, tokens: int) -> None:
        """A response carrying ``tokens`` (or, for the OpenAI frontend, text) came in now."""
        if not self.arrivals:
            self.first_tokens = tokens
        self.arrivals.append(time.perf_counter())

    @property
    def ttft(self) -> float | None:
        return self.arrivals[0] - self.start if self.arrivals else None

    @property
    def decode_rate(self) -> float | None:
        """Tokens per second after the first response: the pace the stream was kept at.

        Apart from the time to the first token, so a wave's admission does not hide how
        well the serving path keeps up with an engine once the stream runs. (OpenAI
        streams count their tokens from ``usage`` at the end: their first response's
        tokens are counted in, a token or so too many.)
        """
        if len(self.arrivals) < 2 or self.arrivals[-1] <= self.arrivals[0]:
            return None
        return (self.tokens - self.first_tokens) / (self.arrivals[-1] - self.arrivals[0])

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]


class Worker(abc.ABC):
    """One closed-loop slot of a client."""

    @abc.abstractmethod
    async def send(self, prompt: str, max_tokens: int, record: StreamRecord) -> None:
        """Send one request and fill ``record`` as its responses arrive (raise on failure)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the slot's connection."""


class Client(abc.ABC):
    """Shared state of one protocol's workers (a channel, an HTTP session)."""

    def __init__(self, url: str, model: str) -> None:
        self.url, self.model = url, model

    @abc.abstractmethod
    async def open(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    @abc.abstractmethod
    def worker(self) -> Worker: ...


# --- gRPC ------------------------------------------------------------------------------


def grpc_request(model: str, prompt: str, max_tokens: int) -> service_pb2.ModelInferRequest:
    """A streamed LLM request asking for ``num_output_tokens`` in every response."""
    request = service_pb2.ModelInferRequest(model_name=model)
    request.parameters["triton_enable_empty_final_response"].bool_param = True

    def tensor(name: str, datatype: str, **contents: Any) -> None:
        item = request.inputs.add(name=name, datatype=datatype, shape=[1])
        for key, value in contents.items():
            getattr(item.contents, key).extend(value)

    tensor("text_input", "BYTES", bytes_contents=[prompt.encode()])
    sampling = json.dumps({"max_tokens": max_tokens}).encode()
    tensor("sampling_parameters", "BYTES", bytes_contents=[sampling])
    tensor("stream", "BOOL", bool_contents=[True])
    tensor("return_num_output_tokens", "BOOL", bool_contents=[True])
    return request


def response_tokens(response: service_pb2.ModelInferResponse) -> int:
    """``num_output_tokens`` of one response (0 when it carries none, e.g. an empty FINAL)."""
    for index, output in enumerate(response.outputs):
        if output.name == "num_output_tokens":
            if index < len(response.raw_output_contents):
                raw = response.raw_output_contents[index]
                return sum(int.from_bytes(raw[i : i + 4], "little") for i in range(0, len(raw), 4))
            return sum(output.contents.uint_contents)
    return 0


class GrpcClient(Client):
    async def open(self) -> None:
        self._channel = grpc.aio.insecure_channel(self.url)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    def worker(self) -> Worker:
        return GrpcWorker(self)


class GrpcWorker(Worker):
    def __init__(self, client: GrpcClient) -> None:
        self._client = client
        self._call: Any = None

    async def send(self, prompt: str, max_tokens: int, record: StreamRecord) -> None:
        if self._call is None:
            self._call = self._client._stub.ModelStreamInfer()
        await self._call.write(grpc_request(self._client.model, prompt, max_tokens))
        while True:
            message = await self._call.read()
            if message is grpc.aio.EOF:
                raise RuntimeError("the gRPC stream ended before the FINAL response")
            if message.error_message:
                raise RuntimeError(message.error_message)
            response = message.infer_response
            tokens = response_tokens(response)
            if tokens:
                record.arrived(tokens)
                record.tokens += tokens
            final = response.parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                return

    async def close(self) -> None:
        if self._call is not None:
            await self._call.done_writing()
            self._call.cancel()


# --- HTTP (Triton generate_stream and the OpenAI frontend) -------------------------------


class HttpClient(Client):
    """One aiohttp session; each worker keeps its own connection alive."""

    path: str

    async def open(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
        self._session = aiohttp.ClientSession(connector=connector, timeout=timeout)

    async def close(self) -> None:
        await self._session.close()

    def worker(self) -> Worker:
        return SseWorker(self)

    @abc.abstractmethod
    def body(self, prompt: str, max_tokens: int) -> dict[str, Any]: ...

    @abc.abstractmethod
    def tokens(self, event: dict[str, Any]) -> tuple[int, bool]:
        """(tokens this event carries, whether it carries text: one arrival)."""


class SseWorker(Worker):
    def __init__(self, client: HttpClient) -> None:
        self._client = client

    async def send(self, prompt: str, max_tokens: int, record: StreamRecord) -> None:
        client = self._client
        url = f"http://{client.url}{client.path}"
        async with client._session.post(url, json=client.body(prompt, max_tokens)) as reply:
            if reply.status != 200:
                raise RuntimeError(f"HTTP {reply.status}: {(await reply.text())[:200]}")
            async for line in reply.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    raise RuntimeError(str(event["error"])[:200])
                tokens, arrived = client.tokens(event)
                if arrived:
                    record.arrived(tokens)
                record.tokens += tokens

    async def close(self) -> None:
        """Nothing of its own: the session keeps the connection for the next request."""


class GenerateStreamClient(HttpClient):
    def __init__(self, url: str, model: str) -> None:
        super().__init__(url, model)
        self.path = f"/v2/models/{model}/generate_stream"

    def body(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        return {
            "text_input": prompt,
            "stream": True,
            "sampling_parameters": json.dumps({"max_tokens": max_tokens}),
            "return_num_output_tokens": True,
            "exclude_input_in_output": True,
        }

    def tokens(self, event: dict[str, Any]) -> tuple[int, bool]:
        value = event.get("num_output_tokens", 0)
        count = sum(value) if isinstance(value, list) else int(value)
        return count, count > 0


class OpenAIClient(HttpClient):
    """Streamed chat or text completions; the token count is the final usage chunk's."""

    def __init__(self, url: str, model: str, chat: bool) -> None:
        super().__init__(url, model)
        self.chat = chat
        self.path = "/v1/chat/completions" if chat else "/v1/completions"

    def body(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return body

    def tokens(self, event: dict[str, Any]) -> tuple[int, bool]:
        usage = event.get("usage")
        tokens = int(usage.get("completion_tokens", 0)) if usage else 0
        choices = event.get("choices") or []
        if not choices:
            return tokens, False
        choice = choices[0]
        text = (choice.get("delta") or {}).get("content") if self.chat else choice.get("text")
        return tokens, bool(text)


def make_client(protocol: str, url: str, model: str) -> Client:
    """The client for ``protocol``; ``url`` is host:port of the server that speaks it."""
    if protocol == "grpc":
        return GrpcClient(url, model)
    if protocol == "http":
        return GenerateStreamClient(url, model)
    if protocol in ("openai_chat", "openai_completions"):
        return OpenAIClient(url, model, chat=protocol == "openai_chat")
    raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
