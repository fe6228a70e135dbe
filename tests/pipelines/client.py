"""A gRPC streaming client for pipeline tests: real tritonclient, one request per call."""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient


def bytes_input(name: str, value: str | bytes) -> grpcclient.InferInput:
    raw = value.encode() if isinstance(value, str) else value
    tensor = grpcclient.InferInput(name, [1], "BYTES")
    tensor.set_data_from_numpy(np.array([raw], dtype=np.object_))
    return tensor


def bool_input(name: str, value: bool) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, [1], "BOOL")
    tensor.set_data_from_numpy(np.array([value], dtype=bool))
    return tensor


def text_request(
    prompt: str, sampling: dict | None = None, stream: bool = True, **flags: bool
) -> list[grpcclient.InferInput]:
    """vllm_model-style inputs (non-streamed requests exclude the prompt from the output)."""
    inputs = [bytes_input("text_input", prompt), bool_input("stream", stream)]
    if sampling is not None:
        inputs.append(bytes_input("sampling_parameters", json.dumps(sampling)))
    if not stream:
        flags.setdefault("exclude_input_in_output", True)
    return inputs + [bool_input(name, value) for name, value in flags.items()]


@dataclass
class Streamed:
    responses: list[Any] = field(default_factory=list)
    error: Exception | None = None

    def texts(self, name: str = "text_output") -> list[str]:
        return [
            b"".join(r.as_numpy(name).reshape(-1)).decode()
            for r in self.responses
            if r.as_numpy(name) is not None
        ]

    @property
    def text(self) -> str:
        return "".join(self.texts())


def _is_final(result: Any) -> bool:
    params = result.get_response().parameters
    return "triton_final_response" in params and params["triton_final_response"].bool_param


def stream(
    url: str,
    model: str,
    inputs: list[grpcclient.InferInput],
    *,
    stop_after: int | None = None,
    on_response: Callable[[int], None] | None = None,
    timeout_s: float = 300.0,
) -> Streamed:
    """Send one request on a gRPC stream; ``stop_after`` N responses cancels it."""
    events: queue.Queue = queue.Queue()
    result = Streamed()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        deadline = time.monotonic() + timeout_s
        while True:
            response, error = events.get(timeout=max(0.1, deadline - time.monotonic()))
            if error is not None:
                result.error = error
                break
            if response.get_response().outputs:
                result.responses.append(response)
                if on_response:
                    on_response(len(result.responses))
            if _is_final(response):
                break
            if stop_after is not None and len(result.responses) >= stop_after:
                break
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    return result
