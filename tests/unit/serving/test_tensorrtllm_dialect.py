"""TensorRT-LLM request dialects onto the common schema: upstream llmapi and genai-perf."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tritonforge.serving.dialects.tensorrtllm import DIALECT
from tritonforge.serving.errors import RequestError
from tritonforge.serving.schema import PROMPT_INPUTS, RETURN_INPUTS, parse_request


def text(value: str) -> np.ndarray:
    return np.array([value.encode()], dtype=np.object_)


def i32(value: int) -> np.ndarray:
    return np.array([value], dtype=np.int32)


def texts(*values: str) -> np.ndarray:
    return np.array([v.encode() for v in values], dtype=np.object_)


def parse(inputs: dict):
    common, sampling = DIALECT.translate(inputs)
    return parse_request(common, None, sampling)


def test_upstream_llmapi_request() -> None:
    request = parse(
        {
            "text_input": text("Hello"),
            "streaming": np.array([True]),
            "sampling_param_temperature": np.array([0.5], dtype=np.float32),
            "sampling_param_top_k": np.array([5], dtype=np.int32),
            "sampling_param_top_p": np.array([0.9], dtype=np.float32),
            "sampling_param_max_tokens": np.array([12], dtype=np.int32),
            "sampling_param_seed": np.array([3], dtype=np.uint64),
            "sampling_param_stop": texts("\n\n", "END"),
            "sampling_param_best_of": np.array([1], dtype=np.int32),
            "return_finish_reason": np.array([True]),
        }
    )
    assert request.stream is True and request.prompt == "Hello"
    s = request.sampling
    assert (s.temperature, s.top_k, s.max_tokens, s.seed) == (0.5, 5, 12, 3)
    assert s.top_p == pytest.approx(0.9)
    assert s.stop == ("\n\n", "END")
    assert request.returns.finish_reason


def test_genai_perf_tensorrtllm_request() -> None:
    """What genai-perf --backend tensorrtllm sends (inputs/converters/tensorrtllm_converter)."""
    request = parse(
        {
            "text_input": text("Hello"),
            "max_tokens": np.array([64], dtype=np.int32),
            "min_length": np.array([64], dtype=np.int32),
            "exclude_input_in_output": np.array([True]),
            "stream": np.array([True]),
            "ignore_eos": np.array([True]),
        }
    )
    s = request.sampling
    assert (s.max_tokens, s.min_tokens, s.ignore_eos) == (64, 64, True)
    assert request.stream and not request.prepend_input


def test_the_sampling_parameters_tensor_wins_over_dialect_tensors() -> None:
    request = parse(
        {
            "text_input": text("x"),
            "max_tokens": np.array([64], dtype=np.int32),
            "sampling_parameters": text('{"max_tokens": 5}'),
        }
    )
    assert request.sampling.max_tokens == 5


@pytest.mark.parametrize(
    ("inputs", "field", "rule"),
    [
        ({"sampling_param_top_p": np.float32([1.5])}, "sampling_param_top_p", "(0, 1]"),
        ({"max_tokens": i32(0)}, "max_tokens", ">= 1"),
        ({"runtime_top_k": np.int32([1, 2])}, "runtime_top_k", "exactly one"),
        ({"sampling_param_best_of": i32(2)}, "sampling_param_best_of", "only 1"),
        ({"beam_width": i32(4)}, "beam_width", "no beam search"),
        ({"bad_words": texts("bad")}, "bad_words", "not supported"),
        ({"stop": np.array([True])}, "stop", "cancel the request's stream"),
        ({"return_stop_reason": np.array([True])}, "return_stop_reason", "not supported"),
        (
            {"streaming": np.array([True]), "stream": np.array([False])},
            "streaming",
            "disagrees with stream",
        ),
    ],
)  # fmt: skip
def test_bad_dialect_inputs_name_the_tensor(inputs: dict, field: str, rule: str) -> None:
    with pytest.raises(RequestError) as info:
        parse({"text_input": text("x"), **inputs})
    assert info.value.field == field and rule in info.value.rule


def test_neutral_values_and_empty_lists_are_accepted() -> None:
    request = parse(
        {
            "text_input": text("x"),
            "bad_words": texts(""),
            "stop_words": texts(""),
            "beam_width": np.array([1], dtype=np.int32),
            "stop": np.array([False]),
        }
    )
    assert request.sampling.stop == ()


def test_declared_inputs_are_distinct_and_beyond_the_common_schema() -> None:
    names = [spec["name"] for spec in DIALECT.inputs]
    assert len(names) == len(set(names))
    common = {*PROMPT_INPUTS, *RETURN_INPUTS, "sampling_parameters", "stream"}
    assert not set(names) & (common | {"exclude_input_in_output"})


def test_the_shipped_model_config_declares_every_dialect_input() -> None:
    """Auto-complete adds these inputs; the repository's config.pbtxt spells them out."""
    config = Path(__file__).parents[3] / "model_repository/tensorrt_llm_model/config.pbtxt"
    declared = dict(re.findall(r'name: "(\w+)" data_type: (\w+)', config.read_text()))
    assert {s["name"]: s["data_type"] for s in DIALECT.inputs}.items() <= declared.items()
