"""TensorRT-LLM's request dialects: upstream's llmapi Triton model and genai-perf.

Clients of upstream's llmapi model send sampling settings as tensors of their own
(``sampling_param_temperature`` …) and ask for streaming with ``streaming``; genai-perf
``--backend tensorrtllm`` (and the classic TensorRT-LLM backend) sends ``max_tokens``,
``runtime_top_k``, ``stop_words`` …. :data:`DIALECT` maps both onto the common schema,
so those clients work unchanged against a tritonforge TensorRT-LLM model. Values are
validated by the sampling vocabulary, so an error names the tensor the client sent;
inputs the engine cannot honour are accepted only at their neutral value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from tritonforge.serving.dialects import Dialect
from tritonforge.serving.errors import RequestError
from tritonforge.serving.sampling import parse_sampling_value


def _spec(name: str, dtype: str, dims: list[int] | None = None) -> dict[str, Any]:
    return {"name": name, "data_type": dtype, "dims": dims or [1], "optional": True}


# Upstream llmapi model: tensor -> common sampling key.
LLMAPI_SAMPLING = {
    "sampling_param_temperature": ("temperature", "TYPE_FP32"),
    "sampling_param_top_k": ("top_k", "TYPE_INT32"),
    "sampling_param_top_p": ("top_p", "TYPE_FP32"),
    "sampling_param_frequency_penalty": ("frequency_penalty", "TYPE_FP32"),
    "sampling_param_presence_penalty": ("presence_penalty", "TYPE_FP32"),
    "sampling_param_max_tokens": ("max_tokens", "TYPE_INT32"),
    "sampling_param_seed": ("seed", "TYPE_UINT64"),
}
# genai-perf --backend tensorrtllm and the classic TensorRT-LLM backend tensors.
TRTLLM_SAMPLING = {
    "max_tokens": ("max_tokens", "TYPE_INT32"),
    "min_length": ("min_tokens", "TYPE_INT32"),
    "temperature": ("temperature", "TYPE_FP32"),
    "runtime_top_k": ("top_k", "TYPE_INT32"),
    "runtime_top_p": ("top_p", "TYPE_FP32"),
    "random_seed": ("seed", "TYPE_UINT64"),
    "repetition_penalty": ("repetition_penalty", "TYPE_FP32"),
    "presence_penalty": ("presence_penalty", "TYPE_FP32"),
    "frequency_penalty": ("frequency_penalty", "TYPE_FP32"),
    "ignore_eos": ("ignore_eos", "TYPE_BOOL"),
}
STOP_LISTS = ("sampling_param_stop", "stop_words")
# Inputs accepted only at their neutral value; anything else is refused by name.
NEUTRAL_ONLY = {
    "sampling_param_best_of": ("TYPE_INT32", 1, "only 1 is supported (one sequence per request)"),
    "beam_width": ("TYPE_INT32", 1, "only 1 is supported (no beam search)"),
    "sampling_param_return_perf_metrics": ("TYPE_BOOL", False, "is not supported"),
    "return_stop_reason": ("TYPE_BOOL", False, "is not supported; use return_finish_reason"),
    "stop": (
        "TYPE_BOOL",
        False,
        "stopping a request by id is not supported; cancel the request's stream instead",
    ),
}

INPUTS: tuple[dict[str, Any], ...] = (
    _spec("streaming", "TYPE_BOOL"),
    _spec("sampling_param_exclude_input_from_output", "TYPE_BOOL"),
    *(_spec(name, dtype) for name, (_, dtype) in LLMAPI_SAMPLING.items()),
    *(_spec(name, dtype) for name, (_, dtype) in TRTLLM_SAMPLING.items()),
    *(_spec(name, "TYPE_STRING", [-1]) for name in (*STOP_LISTS, "bad_words")),
    *(_spec(name, dtype) for name, (dtype, _, _) in NEUTRAL_ONLY.items()),
)


def _scalar(name: str, array: npt.NDArray[Any]) -> Any:
    if array.size != 1:
        raise RequestError(name, f"expected exactly one element, got shape {tuple(array.shape)}")
    value = array.reshape(-1)[0]
    return value.item() if isinstance(value, np.generic) else value


def _strings(name: str, array: npt.NDArray[Any]) -> list[str]:
    out = []
    for i, value in enumerate(array.reshape(-1)):
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                raise RequestError(f"{name}[{i}]", "is not valid UTF-8") from None
        if not isinstance(value, str):
            raise RequestError(name, f"expected strings (BYTES), got {array.dtype}")
        out.append(value)
    return out


def translate(
    inputs: Mapping[str, npt.NDArray[Any]],
) -> tuple[dict[str, npt.NDArray[Any]], dict[str, Any]]:
    """Map upstream llmapi / genai-perf tensors onto the common schema (pure, unit-tested)."""
    common = dict(inputs)
    sampling: dict[str, Any] = {}
    if "streaming" in common:
        streaming = common.pop("streaming")
        if "stream" in common and bool(_scalar("stream", common["stream"])) != bool(
            _scalar("streaming", streaming)
        ):
            raise RequestError("streaming", "disagrees with stream; send one of them")
        common["stream"] = streaming
    if "sampling_param_exclude_input_from_output" in common:
        common["exclude_input_in_output"] = common.pop("sampling_param_exclude_input_from_output")
    for table in (TRTLLM_SAMPLING, LLMAPI_SAMPLING):
        for name, (key, _) in table.items():
            if name in common:
                sampling[key] = parse_sampling_value(key, _scalar(name, common.pop(name)), name)
    stops: list[str] = []
    for name in STOP_LISTS:
        if name in common:
            stops += [s for s in _strings(name, common.pop(name)) if s]
    if stops:
        sampling["stop"] = parse_sampling_value("stop", stops, STOP_LISTS[0])
    if "bad_words" in common and any(_strings("bad_words", common.pop("bad_words"))):
        raise RequestError("bad_words", "is not supported (send an empty list or omit it)")
    for name, (_, neutral, rule) in NEUTRAL_ONLY.items():
        if name in common:
            value = _scalar(name, common.pop(name))
            if value != neutral:
                raise RequestError(name, f"{rule}, got {value!r}")
    return common, sampling


DIALECT = Dialect(inputs=INPUTS, translate=translate)
