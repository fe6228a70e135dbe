"""The Python-backend floor: ``max_tokens`` one-token responses from a thread per request.

Deliberately nothing but Triton's own API: no parsing beyond ``max_tokens``, no queue,
no event loop. The tensors of a token response are built once and reused.
"""

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


def _stream(sender, count: int) -> None:
    text = pb_utils.Tensor("text_output", np.array([b" tok"], dtype=np.object_))
    one = pb_utils.Tensor("num_output_tokens", np.array([1], dtype=np.uint32))
    for i in range(count):
        response = pb_utils.InferenceResponse(output_tensors=[text, one])
        sender.send(response, flags=FINAL if i == count - 1 else 0)


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                count = max(_max_tokens(request), 1)
            except (ValueError, TypeError) as exc:
                error = pb_utils.TritonError(f"sampling_parameters: {exc}")
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                continue
            threading.Thread(target=_stream, args=(sender, count), daemon=True).start()
        return None
