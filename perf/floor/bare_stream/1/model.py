"""The Python-backend floor: ``max_tokens`` one-token responses, Triton's own API alone.

Deliberately nothing but Triton's own API: no parsing beyond ``max_tokens``, no event
loop. By default each request gets a thread that sends its responses, reusing two
tensors built once. Two parameters change one thing each, so that a run can split the
runtime's cost per response into its parts:

* ``sender_threads`` N > 0: a pool of N threads shared by all requests sends instead —
  the runtime's shape (its ``response_threads``). Requests wait in one queue; a thread
  takes the next, sends it one token and puts it back at the end, so the requests
  interleave the way the runtime's do.
* ``build_tensors`` ``"true"``: each response's tensors are built anew, not reused.
* ``step_ms`` T > 0: each request's thread paces its tokens like an engine that makes one
  token per sequence every T ms; the tokens that fell due while a send was on its way
  go out together in the next response (``num_output_tokens`` says how many), the least
  a Python model can do to keep up with such an engine.
"""

import collections
import json
import threading
import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _max_tokens(request: Any) -> int:
    tensor = pb_utils.get_input_tensor_by_name(request, "sampling_parameters")
    if tensor is None:
        return 16
    return int(json.loads(tensor.as_numpy().reshape(-1)[0]).get("max_tokens", 16))


def _token_tensors(count: int = 1) -> list[Any]:
    return [
        pb_utils.Tensor("text_output", np.array([b" tok" * count], dtype=np.object_)),
        pb_utils.Tensor("num_output_tokens", np.array([count], dtype=np.uint32)),
    ]


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        parameters = json.loads(args["model_config"]).get("parameters", {})

        def parameter(key: str, default: str) -> str:
            return str(parameters.get(key, {}).get("string_value", default))

        self.build = parameter("build_tensors", "false").lower() == "true"
        threads = int(parameter("sender_threads", "0"))
        self.step_s = float(parameter("step_ms", "0")) / 1000
        if self.step_s > 0 and threads > 0:
            raise ValueError("step_ms paces a thread per request: set sender_threads to 0")
        self.batches: dict[int, list[Any]] = {}  # tensors of a response carrying n tokens, by n
        self.pooled = threads > 0
        self.ready = threading.Condition()
        self.waiting: collections.deque[tuple[Any, int]] = collections.deque()  # the pool's
        for index in range(threads):
            threading.Thread(target=self._pool_sender, name=f"sender-{index}", daemon=True).start()

    def _tensors(self, reused: list[Any]) -> list[Any]:
        return _token_tensors() if self.build else reused

    def _stream(self, sender: Any, count: int) -> None:
        """A thread of one request: all its responses."""
        if self.step_s > 0:
            self._stream_paced(sender, count)
            return
        reused = _token_tensors()
        for i in range(count):
            response = pb_utils.InferenceResponse(output_tensors=self._tensors(reused))
            sender.send(response, flags=FINAL if i == count - 1 else 0)

    def _stream_paced(self, sender: Any, count: int) -> None:
        """A thread of one request whose token i falls due (i + 1) steps after its start."""
        start, sent = time.monotonic(), 0
        while sent < count:
            due = min(count, int((time.monotonic() - start) / self.step_s))
            if due <= sent:
                time.sleep(max(0.0, start + (sent + 1) * self.step_s - time.monotonic()))
                continue
            tensors = self.batches.get(due - sent)
            if tensors is None:
                tensors = self.batches.setdefault(due - sent, _token_tensors(due - sent))
            response = pb_utils.InferenceResponse(output_tensors=tensors)
            sender.send(response, flags=FINAL if due == count else 0)
            sent = due

    def _pool_sender(self) -> None:
        """A thread of the pool: one token of the next waiting request at a time."""
        reused = _token_tensors()
        while True:
            with self.ready:
                self.ready.wait_for(lambda: self.waiting)
                sender, left = self.waiting.popleft()
            response = pb_utils.InferenceResponse(output_tensors=self._tensors(reused))
            sender.send(response, flags=FINAL if left == 1 else 0)
            if left > 1:
                with self.ready:
                    self.waiting.append((sender, left - 1))

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                count = max(_max_tokens(request), 1)
            except (ValueError, TypeError) as exc:
                error = pb_utils.TritonError(f"sampling_parameters: {exc}")
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                continue
            if not self.pooled:
                threading.Thread(target=self._stream, args=(sender, count), daemon=True).start()
                continue
            with self.ready:
                self.waiting.append((sender, count))
                self.ready.notify()
        return None
