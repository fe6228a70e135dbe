"""A pipeline model's streamed call to another model of its own server, over gRPC.

``guarded_chat`` serves each client request on a thread of its own (W4) and streams the
inner LLM's answer on that thread. python_backend 24.10's decoupled BLS cannot be used
from several threads at once (W17, docs/triton-2.51-workarounds.md): its response
iterators deadlock the stub (an iterator woken by a response waits for the GIL while
holding its lock; the thread delivering the next response holds the map of calls and
waits for that lock; a thread starting a call holds the GIL and waits for the map), and
a finished call's response tensors are freed on a stub thread without the GIL, which
corrupted the stub's heap. So the inner request goes to the server's own gRPC port, as
any client's would: one channel per model instance, one stream per request, read on a
thread of its own so the caller can watch its client's cancellation while the inner
model is silent.

The server's gRPC address is read from its command line (every stub is a child of
tritonserver), so no configuration has to repeat it.
"""

from __future__ import annotations

import contextlib
import os
import queue
import struct
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import np_to_triton_dtype

#: Triton's defaults when its command line does not name them.
DEFAULT_GRPC_PORT = 8001
#: The response parameter Triton sets on a stream's last response (a transport flag, not
#: one of the models' parameters).
FINAL_FLAG = "triton_final_response"


def server_grpc_url(pid: int | None = None, proc: Path = Path("/proc")) -> str:
    """``host:port`` of the gRPC endpoint of tritonserver ``pid`` (default: this process's
    parent, the server that started this stub), from its command line."""
    raw = (proc / str(os.getppid() if pid is None else pid) / "cmdline").read_bytes()
    args = [a.decode() for a in raw.split(b"\0") if a]
    options: dict[str, str] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            if not eq and i + 1 < len(args) and not args[i + 1].startswith("--"):
                value = args[i + 1]
            options[name] = value
    if options.get("allow-grpc", "true").lower() in ("false", "0"):
        raise RuntimeError("tritonserver runs without gRPC (--allow-grpc=false)")
    host = options.get("grpc-address", "0.0.0.0")
    host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    return f"{host}:{options.get('grpc-port', DEFAULT_GRPC_PORT)}"


@dataclass(frozen=True)
class InnerResponse:
    """One streamed response of the inner model (outputs it lacks are None)."""

    text: str | None = None
    finish_reason: str | None = None
    num_input_tokens: int | None = None
    num_output_tokens: int | None = None
    error: str | None = None
    final: bool = False


def _elements(raw: bytes) -> list[bytes]:
    """A BYTES tensor's elements: each a little-endian uint32 length, then the bytes."""
    out, at = [], 0
    while at + 4 <= len(raw):
        (size,) = struct.unpack_from("<I", raw, at)
        out.append(raw[at + 4 : at + 4 + size])
        at += 4 + size
    return out


def _response(message: Any) -> InnerResponse:
    if message.error_message:
        return InnerResponse(error=message.error_message, final=True)
    response = message.infer_response
    found: dict[str, Any] = {}
    for index, tensor in enumerate(response.outputs):
        raw = response.raw_output_contents[index]
        if tensor.name == "text_output":
            found["text"] = b"".join(_elements(raw)).decode("utf-8")
        elif tensor.name == "finish_reason":
            found[tensor.name] = b"".join(_elements(raw)).decode("utf-8")
        elif tensor.name in ("num_input_tokens", "num_output_tokens"):
            found[tensor.name] = sum(struct.unpack(f"<{len(raw) // 4}I", raw))
    final = response.parameters.get(FINAL_FLAG)
    return InnerResponse(**found, final=bool(final is not None and final.bool_param))


def _tensor(name: str, array: npt.NDArray[Any]) -> tuple[Any, bytes]:
    datatype = np_to_triton_dtype(array.dtype)
    if datatype == "BYTES":
        raw = b"".join(
            struct.pack("<I", len(b)) + b
            for b in (v.encode() if isinstance(v, str) else bytes(v) for v in array.flat)
        )
    else:
        raw = np.ascontiguousarray(array).tobytes()
    spec = service_pb2.ModelInferRequest.InferInputTensor(
        name=name, datatype=datatype, shape=list(array.shape)
    )
    return spec, raw


class InnerStreams:
    """Streamed requests to models of the server at ``url``, one gRPC channel for all."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._channel = grpc.insecure_channel(url)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def stream(
        self,
        model: str,
        tensors: Mapping[str, npt.NDArray[Any]],
        outputs: Sequence[str],
        request_id: str,
        parameters: Mapping[str, str] | None = None,
        idle_s: float = 0.1,
        metadata: Mapping[str, str] | None = None,
    ) -> Iterator[InnerResponse | None]:
        """The inner request's responses until its FINAL (or an error, given as the
        last response); ``None`` after every ``idle_s`` without one, so the caller can
        look at its own client meanwhile. ``metadata`` goes with the gRPC call (Triton
        reads a ``traceparent`` there).

        Closing the iterator before the end cancels the inner request (only then: a
        cancel after the end is Triton 2.51's W14 trap).
        """
        request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
        for name, array in tensors.items():
            spec, raw = _tensor(name, array)
            request.inputs.append(spec)
            request.raw_input_contents.append(raw)
        for name in outputs:
            request.outputs.append(
                service_pb2.ModelInferRequest.InferRequestedOutputTensor(name=name)
            )
        for key, value in (parameters or {}).items():
            request.parameters[key].string_param = value
        request.parameters["triton_enable_empty_final_response"].bool_param = True  # see FINAL_FLAG
        done = threading.Event()

        def requests() -> Iterator[Any]:
            yield request
            done.wait()  # half-closing early would let the server end the call

        call = self._stub.ModelStreamInfer(requests(), metadata=tuple((metadata or {}).items()))
        arrived: queue.SimpleQueue[InnerResponse | BaseException] = queue.SimpleQueue()

        def read() -> None:
            try:
                for message in call:
                    arrived.put(_response(message))
            except BaseException as exc:  # a cancel, the server gone
                arrived.put(exc)
            arrived.put(
                InnerResponse(error="the inner stream ended without a final response", final=True)
            )

        reader = threading.Thread(target=read, name="inner-stream", daemon=True)
        reader.start()
        ended = False
        try:
            while True:
                try:
                    item = arrived.get(timeout=idle_s)
                except queue.Empty:
                    yield None
                    continue
                if isinstance(item, BaseException):
                    ended = True
                    raise item
                ended = item.final
                yield item
                if ended:
                    return
        finally:
            done.set()
            if not ended:
                call.cancel()
            with contextlib.suppress(RuntimeError):
                reader.join(timeout=10)
