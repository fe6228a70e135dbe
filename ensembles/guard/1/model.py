"""guard: redact e-mail addresses, phone numbers, payment cards and IBANs in a text.

A stateless python model over :mod:`tritonforge.pipelines.guard`. Python rather than C++ by
measurement (docs/guard.md): scanning a chat-sized text costs tens of microseconds,
well under the python backend's own per-request cost, and guarded_chat calls the same
code in-process per streamed chunk, which a C++ model could only offer through a
server round trip per chunk.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from tritonforge.pipelines.guard import findings_json, redact


def _text(request: Any) -> str:
    tensor = pb_utils.get_input_tensor_by_name(request, "text_input")
    values = tensor.as_numpy().reshape(-1)
    if values.size != 1:
        raise ValueError(f"text_input: expected exactly one element, got {values.size}")
    value = values[0]
    if not isinstance(value, bytes):
        raise ValueError(f"text_input: expected a string (BYTES), got {tensor.as_numpy().dtype}")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"text_input: is not valid UTF-8 (byte {exc.start})") from None


class TritonPythonModel:
    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                redacted, findings = redact(_text(request))
            except ValueError as exc:
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor(
                            "text_output", np.array([redacted.encode()], dtype=np.object_)
                        ),
                        pb_utils.Tensor(
                            "findings",
                            np.array([findings_json(findings).encode()], dtype=np.object_),
                        ),
                    ]
                )
            )
        return responses
