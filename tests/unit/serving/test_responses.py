"""Output tensors built from engine deltas, and engine-config path handling."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tritonforge.engines.base import EngineOutput
from tritonforge.engines.config import load_engine_config, resolve_path
from tritonforge.serving.responses import Generation, build_outputs
from tritonforge.serving.schema import ReturnFlags

ALL = ReturnFlags(True, True, True, True, True, True)


def test_streamed_delta_carries_only_what_the_step_added() -> None:
    delta = EngineOutput(text=" Par", token_ids=[7, 8], cumulative_logprob=-1.5)
    tensors = build_outputs(delta, ALL, num_input_tokens=12)
    assert tensors["text_output"][0] == b" Par"
    assert tensors["num_output_tokens"].tolist() == [2]
    assert tensors["num_input_tokens"].dtype == np.uint32 and tensors["num_input_tokens"][0] == 12
    assert tensors["output_ids"].dtype == np.int32 and tensors["output_ids"].tolist() == [7, 8]
    assert tensors["finish_reason"][0] == b"None"  # upstream: str() of an unfinished reason


def test_only_requested_outputs_are_sent() -> None:
    tensors = build_outputs(EngineOutput(text="x"), ReturnFlags(), num_input_tokens=1)
    assert set(tensors) == {"text_output"}


def test_generation_aggregates_deltas_and_echoes_prompt() -> None:
    generation = Generation()
    generation.add(EngineOutput(text="é", token_ids=[1], logprobs=[{1: {"logprob": -0.1}}]))
    generation.add(EngineOutput(text="t", token_ids=[2], finished=True, finish_reason="length"))
    tensors = build_outputs(generation.as_output(), ALL, 3, prefix="Q: ")
    assert tensors["text_output"][0].decode() == "Q: ét"
    assert tensors["num_output_tokens"].tolist() == [2]
    assert tensors["finish_reason"][0] == b"length"
    assert json.loads(tensors["logprobs"][0]) == [{"1": {"logprob": -0.1}}]


def test_engine_config_paths_expand_and_resolve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TF_TEST_MODELS", "/models")
    assert resolve_path("$TF_TEST_MODELS/m", tmp_path) == "/models/m"
    (tmp_path / "weights").mkdir()
    assert resolve_path("weights", tmp_path) == str(tmp_path / "weights")
    with pytest.raises(ValueError, match="not set"):
        resolve_path("$TF_TEST_UNSET_VAR/m", tmp_path)
    (tmp_path / "model.json").write_text('{"model": "x", "dtype": "bfloat16"}')
    assert load_engine_config(tmp_path, "model.json")["dtype"] == "bfloat16"
    (tmp_path / "bad.json").write_text("[1]")
    with pytest.raises(ValueError, match="mapping"):
        load_engine_config(tmp_path, "bad.json")
