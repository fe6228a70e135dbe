"""Python-backend twin of the C++ `preprocessing` model: text -> ids with HF `tokenizers`.

It exists to be measured against (perf/tokenizer) and to serve Python-preprocessing
ensembles, so it behaves like the C++ model in every way a client can see: same tensors,
same parameters (`tokenizer_file` with $VAR expansion, `add_special_tokens`, `pad_id`),
same per-request `add_special_tokens` override, an error response (not a crash) for bad
input.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer

from tritonforge.engines.config import expand_env


def _flag(name: str, value: object) -> bool:
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"parameter '{name}' must be true or false, got '{value}'")


class TritonPythonModel:
    """Encodes every request of a batch with one `encode_batch` call."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        if not params.get("tokenizer_file"):
            raise pb_utils.TritonModelException("parameter 'tokenizer_file' is required")
        try:
            path = Path(expand_env(params["tokenizer_file"]))
        except ValueError as exc:
            raise pb_utils.TritonModelException(str(exc)) from None
        if not path.is_absolute():
            path = Path(args["model_repository"]) / path
        if not path.is_file():
            raise pb_utils.TritonModelException(f"tokenizer file '{path}' does not exist")
        self.tokenizer = Tokenizer.from_file(str(path))
        self.add_special_tokens = _flag(
            "add_special_tokens", params.get("add_special_tokens", "true")
        )
        self.pad_id = int(params.get("pad_id", "0"))

    def execute(self, requests: list) -> list:
        return [self._encode(request) for request in requests]

    def _encode(self, request: object) -> object:
        try:
            texts = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            add_special = self.add_special_tokens
            parameters = json.loads(request.parameters() or "{}")
            if "add_special_tokens" in parameters:
                add_special = _flag("add_special_tokens", parameters["add_special_tokens"])
            strings = []
            for row, raw in enumerate(texts.reshape(-1)):
                try:
                    strings.append(raw.decode("utf-8") if isinstance(raw, bytes) else str(raw))
                except UnicodeDecodeError as exc:
                    raise ValueError(
                        f"text_input[{row}]: text is not valid UTF-8 "
                        f"(invalid byte at byte offset {exc.start})"
                    ) from exc
            encodings = self.tokenizer.encode_batch(strings, add_special_tokens=add_special)
        except (ValueError, TypeError) as exc:
            return pb_utils.InferenceResponse(
                error=pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
            )
        longest = max((len(e.ids) for e in encodings), default=0)
        ids = np.full((len(encodings), longest), self.pad_id, dtype=np.int32)
        for row, encoding in enumerate(encodings):
            ids[row, : len(encoding.ids)] = encoding.ids
        lengths = np.array([[len(e.ids)] for e in encodings], dtype=np.int32)
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("input_ids", ids),
                pb_utils.Tensor("input_lengths", lengths),
            ]
        )
