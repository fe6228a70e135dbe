"""The Triton side: one shared asyncio gRPC client, the model catalogue, one stream per request.

Every request opens its own ``ModelStreamInfer`` call on the shared channel (HTTP/2
multiplexes them), writes its one request and half-closes; Triton ends the call after
the request's final response. The models are decoupled, so the stream is the only way
in (Triton refuses the unary ``ModelInfer`` for them), and a call per request gives
cancellation for free: cancelling the call is what Triton's frontend turns into the
request's cancellation, which the model's runtime polls and aborts in the engine.
Embedding models are not decoupled: each of their requests is one unary ``ModelInfer``
carrying a batch of rows, which Triton's dynamic batcher may merge with others.

Model configs are read over gRPC once per model and cached: a request then costs no
control-plane round trip. A model that went away is noticed by its error
("unknown model"), which drops it from the cache.

The frontend outlives a Triton restart (the launcher restarts a crashed server): the
channel reconnects by itself, and its reconnect backoff is capped at a few seconds, so
the first request after Triton is back is served rather than failed for up to gRPC's
default two minutes of backoff. While Triton is down, a call fails at once with
UNAVAILABLE (no wait-for-ready), as :class:`~tritonforge.openai.errors.TritonDown`:
carry_over.py decides whether its request waits for the restarted server or the client
gets a 503 it can retry.

A graceful stop ends the streams still open when its grace period runs out
(:meth:`TritonGateway.end_streams`): each call is cancelled, so Triton cancels its
request, and its reader gets the stop's error instead of a bare cancellation — the
client's answer ends with an error, never a cut connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import weakref
from collections.abc import AsyncIterator
from typing import Any, Literal

import grpc
import numpy as np
import numpy.typing as npt
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from tritonforge.openai import request_context
from tritonforge.openai.embeddings import Prompt, input_error
from tritonforge.openai.errors import (
    OpenAIError,
    from_triton,
    invalid,
    model_not_found,
    unreachable,
)
from tritonforge.openai.translate import ModelOutput, ModelSpec, TritonRequest

#: Which models :meth:`TritonGateway.spec` accepts.
SpecKind = Literal["llm", "embedding", "any"]


def _bytes(name: str, value: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [1], "BYTES")
    tensor.set_data_from_numpy(np.array([value.encode("utf-8")], dtype=np.object_))
    return tensor


def _bool(name: str, value: bool) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [1], "BOOL")
    tensor.set_data_from_numpy(np.array([value], dtype=bool))
    return tensor


def request_inputs(request: TritonRequest) -> list[grpcclient.InferInput]:
    """The request's tensors in the shared schema."""
    if request.prompt_input == "input_ids":
        ids = np.asarray(request.prompt, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= 2**31):
            raise invalid("prompt: token ids must be in [0, 2^31)", "prompt")
        prompt = grpcclient.InferInput("input_ids", [int(ids.size)], "INT32")
        prompt.set_data_from_numpy(ids.astype(np.int32))
    else:
        assert isinstance(request.prompt, str)
        prompt = _bytes(request.prompt_input, request.prompt)
    inputs = [prompt, _bytes("sampling_parameters", json.dumps(request.sampling))]
    inputs += [_bool(name, value) for name, value in request.flags.items()]
    return inputs


def embedding_inputs(rows: list[Prompt]) -> list[grpcclient.InferInput]:
    """One embedding request's rows: texts as ``text_input`` [n, 1], or one token-id
    list as ``input_ids`` [1, length]."""
    if isinstance(rows[0], str):
        texts = np.array([[str(row).encode("utf-8")] for row in rows], dtype=np.object_)
        tensor = grpcclient.InferInput("text_input", list(texts.shape), "BYTES")
        tensor.set_data_from_numpy(texts)
        return [tensor]
    ids = np.array(rows, dtype=np.int32)
    tensor = grpcclient.InferInput("input_ids", list(ids.shape), "INT32")
    tensor.set_data_from_numpy(ids)
    return [tensor]


def _byte_elements(raw: bytes) -> list[bytes]:
    """A BYTES tensor's elements: each is a little-endian uint32 length, then the bytes."""
    elements, at = [], 0
    while at + 4 <= len(raw):
        size = int.from_bytes(raw[at : at + 4], "little")
        elements.append(raw[at + 4 : at + 4 + size])
        at += 4 + size
    return elements


def _text(raw: bytes) -> str:
    """A BYTES tensor's elements joined as text (one element, the usual case, directly)."""
    if len(raw) >= 4 and int.from_bytes(raw[:4], "little") == len(raw) - 4:
        return raw[4:].decode("utf-8")
    return b"".join(_byte_elements(raw)).decode("utf-8")


def _uint32s(raw: bytes) -> tuple[int, ...]:
    return struct.unpack(f"<{len(raw) // 4}I", raw[: len(raw) // 4 * 4])


def parse_response(response: Any) -> ModelOutput:
    """One ``ModelInferResponse`` as a :class:`ModelOutput` (outputs it lacks stay None).

    Read straight from the protobuf, one pass over its outputs: this runs once per
    streamed response, on the same cores as the server, so it builds no numpy arrays
    for what are a few bytes and a couple of integers.
    """
    output = ModelOutput()
    contents = response.raw_output_contents
    for index, tensor in enumerate(response.outputs):
        raw = contents[index] if index < len(contents) else b""
        name = tensor.name
        if name == "text_output" and tensor.shape and tensor.shape[0] > 1:
            return _choices(response)
        if name == "text_output":
            output.text = _text(raw)
        elif name == "finish_reason":
            output.finish_reason = _text(raw)
        elif name == "num_input_tokens":
            output.num_input_tokens = _uint32s(raw)[0] if len(raw) >= 4 else None
        elif name == "num_output_tokens":
            output.num_output_tokens = sum(_uint32s(raw))
        elif name == "logprobs":
            output.logprobs = json.loads(b"".join(_byte_elements(raw)) or b"null") or []
        elif name == "output_ids":
            output.output_ids = list(struct.unpack(f"<{len(raw) // 4}i", raw))
    final = response.parameters.get("triton_final_response")
    output.final = bool(final is not None and final.bool_param)
    return output


def _choices(response: Any) -> ModelOutput:
    """A response of an n > 1 request: one element per sequence in every output, read
    into one :class:`ModelOutput` per sequence (``choices``) under the shared counts."""
    contents = response.raw_output_contents
    columns: dict[str, bytes] = {
        tensor.name: contents[i] if i < len(contents) else b""
        for i, tensor in enumerate(response.outputs)
    }
    texts = [e.decode("utf-8") for e in _byte_elements(columns["text_output"])]
    choices = [ModelOutput(text=t) for t in texts]
    if "finish_reason" in columns:
        for choice, reason in zip(choices, _byte_elements(columns["finish_reason"]), strict=True):
            choice.finish_reason = reason.decode("utf-8")
    if "num_output_tokens" in columns:
        for choice, count in zip(choices, _uint32s(columns["num_output_tokens"]), strict=True):
            choice.num_output_tokens = count
    if "logprobs" in columns:
        for choice, raw in zip(choices, _byte_elements(columns["logprobs"]), strict=True):
            choice.logprobs = json.loads(raw or b"null") or []
    output = ModelOutput(choices=choices)
    if "num_input_tokens" in columns and len(columns["num_input_tokens"]) >= 4:
        output.num_input_tokens = _uint32s(columns["num_input_tokens"])[0]
    if "num_output_tokens" in columns:
        output.num_output_tokens = sum(c.num_output_tokens or 0 for c in choices)
    final = response.parameters.get("triton_final_response")
    output.final = bool(final is not None and final.bool_param)
    return output


def _rpc_error(error: grpc.aio.AioRpcError, model: str, url: str) -> OpenAIError:
    code = error.code()
    if code == grpc.StatusCode.NOT_FOUND:
        return model_not_found(model, "is not loaded")
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return unreachable(url, error.details() or "")
    return from_triton(error.details() or str(code), model)


#: How long a call may take to end after its final response before it is cancelled.
CALL_END_TIMEOUT_S = 5.0


class TritonStream:
    """The model's responses to one request; :meth:`cancel` ends it in Triton too.

    Iterating raises :class:`OpenAIError` for an error response. Iteration stops after
    the final response; a consumer that stops early must call :meth:`cancel`.
    """

    def __init__(self, call: Any, model: str, url: str, on_gone: Any) -> None:
        self._call = call
        self._model = model
        self._url = url
        self._on_gone = on_gone
        self._done = False
        #: Why :meth:`end` cut the stream short: raised once to its reader.
        self._ended_by: OpenAIError | None = None

    def __aiter__(self) -> AsyncIterator[ModelOutput]:
        return self

    def _raise_if_ended(self) -> None:
        if self._ended_by is not None:
            error, self._ended_by = self._ended_by, None
            raise error

    async def __anext__(self) -> ModelOutput:
        if self._done:
            self._raise_if_ended()
            raise StopAsyncIteration
        try:
            result, error = await self._call.__anext__()
        except StopAsyncIteration:
            self._done = True
            self._raise_if_ended()
            raise
        except asyncio.CancelledError:
            # The call cancelled by end(), not this task: the reader gets end()'s error.
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            self._raise_if_ended()
            raise
        except grpc.aio.AioRpcError as exc:
            self._done = True
            raise _rpc_error(exc, self._model, self._url) from None
        if error is not None:
            self._done = True
            await self._read_to_end()
            mapped = from_triton(error.message(), self._model)
            if mapped.status == 404 or "unexpected inference input" in mapped.message:
                self._on_gone(self._model)  # unloaded or reconfigured: read its config again
            raise mapped
        output = parse_response(result.get_response())
        if output.final:
            self._done = True
            await self._read_to_end()
        return output

    async def _read_to_end(self) -> None:
        """Read the call past its last response, to its status (which Triton sends at once).

        A call left waiting after its last response is held in a reference cycle by its
        own response reader: the call, its two tasks and gRPC core's memory for it then
        live until the cyclic garbage collector runs, thousands of requests later. Read
        to its end, it is freed with the request. A call that does not end promptly is
        cancelled.
        """
        ended = False
        try:
            async with asyncio.timeout(CALL_END_TIMEOUT_S):
                await self._call.__anext__()
        except StopAsyncIteration:
            ended = True
        except (grpc.aio.AioRpcError, TimeoutError):
            pass
        finally:
            if not ended:
                self._call.cancel()

    def cancel(self) -> None:
        """Cancel the gRPC call: Triton cancels the request, the engine aborts it."""
        if not self._done:
            self._done = True
            self._call.cancel()

    @property
    def running(self) -> bool:
        """Not ended yet: no final response, error, cancel or end so far."""
        return not self._done

    def end(self, error: OpenAIError) -> None:
        """Cancel a stream still running, and make ``error`` what its reader gets next."""
        if not self._done:
            self._ended_by = error
            self.cancel()


#: gRPC channel settings: Triton's message size limit (what tritonclient sets) and a
#: reconnect backoff capped at 2 s while Triton restarts (gRPC's default grows to 120 s).
CHANNEL_ARGS = [
    ("grpc.max_send_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
    ("grpc.max_receive_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


class TritonGateway:
    """One Triton server: its LLM models and streams to them, over one gRPC client."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._client: grpcaio.InferenceServerClient | None = None
        self._specs: dict[str, ModelSpec] = {}
        self._open: weakref.WeakSet[TritonStream] = weakref.WeakSet()
        #: Set by :meth:`end_streams`: every stream opened after it ends at once with it.
        self._ending: OpenAIError | None = None

    @property
    def client(self) -> grpcaio.InferenceServerClient:
        # Created on first use, inside the running event loop (grpc.aio channels bind to it).
        if self._client is None:
            self._client = grpcaio.InferenceServerClient(self.url, channel_args=CHANNEL_ARGS)
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.close()
            self._client = None

    async def server_ready(self) -> bool:
        try:
            return bool(await self.client.is_server_ready(client_timeout=5))
        except (InferenceServerException, grpc.aio.AioRpcError):
            return False

    async def model_ready(self, model: str) -> bool:
        """Whether ``model`` is ready to serve; False while Triton does not answer."""
        try:
            return bool(await self.client.is_model_ready(model, client_timeout=5))
        except (InferenceServerException, grpc.aio.AioRpcError):
            return False

    def forget(self, model: str) -> None:
        self._specs.pop(model, None)

    async def spec(self, model: str, kind: SpecKind = "llm") -> ModelSpec:
        """The model's schema inputs and outputs; 404 unless it is a loaded model of
        ``kind`` (``llm``: the generate schema; ``embedding``; ``any``: either or neither)."""
        spec = self._specs.get(model) or await self._read_spec(model)
        if kind == "llm" and not spec.is_llm:
            raise model_not_found(model, "is not an LLM model (no text prompt and sampling input)")
        if kind == "embedding" and not spec.is_embedding:
            raise model_not_found(
                model, "is not an embedding model (no text_input input and embedding output)"
            )
        return spec

    async def _read_spec(self, model: str) -> ModelSpec:
        try:
            reply = await self.client.get_model_config(model, as_json=True, client_timeout=10)
        except InferenceServerException as exc:
            status = str(exc.status() or "")
            if "NOT_FOUND" in status or "unknown model" in (exc.message() or ""):
                raise model_not_found(model, "does not exist or is not loaded") from None
            if "UNAVAILABLE" in status or "DEADLINE" in status:
                raise unreachable(self.url) from None
            raise from_triton(exc.message() or status, model) from None
        config = reply.get("config", {})
        spec = ModelSpec(
            name=model,
            inputs=frozenset(i["name"] for i in config.get("input", [])),
            outputs=frozenset(o["name"] for o in config.get("output", [])),
            max_batch_size=int(config.get("max_batch_size", 0)),
        )
        self._specs[model] = spec
        return spec

    async def served_models(self) -> list[str]:
        """Names of the LLM and embedding models that are ready now, from the repository
        index."""
        try:
            index = await self.client.get_model_repository_index(as_json=True, client_timeout=10)
        except InferenceServerException as exc:
            raise unreachable(self.url, exc.message() or "") from None
        names = []
        for entry in index.get("models", []):
            if entry.get("state") != "READY":
                continue
            try:
                spec = await self.spec(entry["name"], "any")
            except OpenAIError:
                continue  # gone since the index was read
            if spec.is_llm or spec.is_embedding:
                names.append(entry["name"])
        return sorted(set(names))

    async def embed(
        self, spec: ModelSpec, items: list[Prompt]
    ) -> list[tuple[npt.NDArray[np.float32], int]]:
        """Each input's vector and token count, in order.

        Texts go in requests of up to the model's ``max_batch_size`` rows, all at once;
        token-id lists one per request (the rows of one tensor share a length). A
        failed request fails the whole call, its error naming the body's input item.
        """
        size = max(spec.max_batch_size, 1) if isinstance(items[0], str) else 1
        groups = [(first, items[first : first + size]) for first in range(0, len(items), size)]
        results = await asyncio.gather(
            *(self._embed_rows(spec.name, rows) for _, rows in groups), return_exceptions=True
        )
        embedded: list[tuple[npt.NDArray[np.float32], int]] = []
        for (first, _), result in zip(groups, results, strict=True):
            if isinstance(result, OpenAIError):
                raise input_error(result, first, len(items) == 1)
            if isinstance(result, BaseException):
                raise result
            embedded.extend(result)
        return embedded

    async def _embed_rows(
        self, model: str, rows: list[Prompt]
    ) -> list[tuple[npt.NDArray[np.float32], int]]:
        try:
            result = await self.client.infer(model, embedding_inputs(rows))
        except InferenceServerException as exc:
            message, status = exc.message() or "", str(exc.status() or "")
            error = from_triton(message, model)
            if error.status == 404:
                self.forget(model)
            if error.status == 500 and "UNAVAILABLE" in status:
                raise unreachable(self.url, message) from None  # Triton itself is down
            raise error from None
        vectors = result.as_numpy("embedding")
        counts = result.as_numpy("num_input_tokens")
        return [(vectors[i], int(counts[i][0])) for i in range(len(rows))]

    def stream(self, model: str, request: TritonRequest) -> TritonStream:
        """Send one request to ``model`` and return its responses as they come.

        It carries the HTTP request's id and trace context (request_context.py).
        """
        inputs = request_inputs(request)
        context = request_context.current()
        settings = request_context.triton_call_settings(context)

        async def one_request() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": model, "inputs": inputs, **settings}

        call = self.client.stream_infer(one_request(), headers=request_context.metadata(context))
        stream = TritonStream(call, model, self.url, self.forget)
        if self._ending is not None:
            stream.end(self._ending)
        else:
            self._open.add(stream)
        return stream

    def end_streams(self, error: OpenAIError) -> int:
        """End every stream still open, and any opened from now on, with ``error`` (a
        graceful stop's grace period is over); how many were open."""
        self._ending = error
        streams = [stream for stream in self._open if stream.running]
        for stream in streams:
            stream.end(error)
        return len(streams)
