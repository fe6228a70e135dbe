"""The Python-backend floor with the runtime's sending shape: a few sender threads for all.

``bare_stream`` gives every request a thread of its own; this project's runtime sends
every request's responses from a small pool (``response_threads``, 2 by default). This
model does only that: requests wait in one queue, and each sender thread takes the
next, sends it one token and puts it back at the end, so the requests interleave the
way the runtime's do. Measured beside ``bare_stream`` and ``synthetic_model`` it splits
the runtime's cost per response into what the shape costs (a pool instead of a thread
per request, one round trip per send), what building a response's tensors costs
(``build_tensors``), and what is the runtime's own.
"""

import collections
import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _max_tokens(request) -> int:
    tensor = pb_utils.get_input_tensor_by_name(request, "sampling_parameters")
    if tensor is None:
        return 16
    return int(json.loads(tensor.as_numpy().reshape(-1)[0]).get("max_tokens", 16))


def _token_tensors() -> list:
    return [
        pb_utils.Tensor("text_output", np.array([b" tok"], dtype=np.object_)),
        pb_utils.Tensor("num_output_tokens", np.array([1], dtype=np.uint32)),
    ]


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})

        def parameter(key: str, default: str) -> str:
            return parameters.get(key, {}).get("string_value", default)

        self.build = parameter("build_tensors", "false").lower() == "true"
        self.ready = threading.Condition()
        self.waiting = collections.deque()  # (sender, tokens left)
        for index in range(int(parameter("sender_threads", "2"))):
            threading.Thread(target=self._send_forever, name=f"sender-{index}", daemon=True).start()

    def _send_forever(self) -> None:
        reused = _token_tensors()  # built once per thread, sent again and again
        while True:
            with self.ready:
                self.ready.wait_for(lambda: self.waiting)
                sender, left = self.waiting.popleft()
            tensors = _token_tensors() if self.build else reused
            response = pb_utils.InferenceResponse(output_tensors=tensors)
            sender.send(response, flags=FINAL if left == 1 else 0)
            if left > 1:
                with self.ready:
                    self.waiting.append((sender, left - 1))

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                count = max(_max_tokens(request), 1)
            except (ValueError, TypeError) as exc:
                error = pb_utils.TritonError(f"sampling_parameters: {exc}")
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                continue
            with self.ready:
                self.waiting.append((sender, count))
                self.ready.notify()
        return None
