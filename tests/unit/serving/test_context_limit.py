"""prompt + max_tokens must fit the model's context: one rule in the core, every engine.

Runs :meth:`Engine.prepare` on the scripted engine (context 100, one token per prompt
character); no server, no model.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests.fakes import ScriptedEngine
from tritonforge.engines.llamacpp import LlamaCppEngine, _Job
from tritonforge.serving.errors import RequestError
from tritonforge.serving.sampling import SamplingParams
from tritonforge.serving.schema import parse_request

ENGINES = Path(__file__).resolve().parents[3] / "tritonforge" / "engines"


def request(prompt: str, **sampling: object):
    inputs = {"text_input": np.array([prompt.encode()], dtype=np.object_)}
    if sampling:
        inputs["sampling_parameters"] = np.array([json.dumps(sampling).encode()], dtype=np.object_)
    return parse_request(inputs)


def test_a_request_that_exactly_fills_the_context_is_accepted() -> None:
    prepared = ScriptedEngine().prepare(request("x" * 60, max_tokens=40))
    assert len(prepared.token_ids) == 60


def test_prompt_plus_max_tokens_beyond_the_context_names_both_numbers() -> None:
    with pytest.raises(RequestError) as info:
        ScriptedEngine().prepare(request("x" * 60, max_tokens=41))
    assert info.value.field == "sampling_parameters.max_tokens"
    assert info.value.rule.startswith(
        "prompt (60 tokens) + max_tokens (41) exceeds the model's context of 100 tokens"
    )
    assert "at most 40" in info.value.rule


def test_the_default_max_tokens_follows_the_same_rule() -> None:
    ScriptedEngine().prepare(request("x" * 84))  # 84 + 16 = 100
    with pytest.raises(RequestError, match=r"prompt \(85 tokens\) \+ max_tokens \(16\)"):
        ScriptedEngine().prepare(request("x" * 85))


def test_token_id_prompts_follow_the_same_rule() -> None:
    inputs = {
        "input_ids": np.array([1] * 90, dtype=np.int32),
        "sampling_parameters": np.array([b'{"max_tokens": 11}'], dtype=np.object_),
    }
    with pytest.raises(RequestError, match=r"prompt \(90 tokens\) \+ max_tokens \(11\)"):
        ScriptedEngine().prepare(parse_request(inputs))


def test_a_prompt_that_fills_the_context_keeps_its_own_error() -> None:
    with pytest.raises(RequestError) as info:
        ScriptedEngine().prepare(request("x" * 100, max_tokens=1))
    assert info.value.field == "text_input"
    assert info.value.rule.startswith("prompt is 100 tokens")


def test_no_engine_adapter_overrides_the_shared_check() -> None:
    """The rule lives once, in Engine.prepare; an adapter overriding it would skip it."""
    for module in ENGINES.glob("*.py"):
        if module.name == "base.py":
            continue
        tree = ast.parse(module.read_text())
        methods = {
            node.name
            for cls in ast.walk(tree)
            if isinstance(cls, ast.ClassDef)
            for node in cls.body
            if isinstance(node, ast.FunctionDef)
        }
        assert "prepare" not in methods, module.name


def test_llamacpp_generates_max_tokens_without_lowering_it() -> None:
    """A max_tokens past the context is the core's refusal, never a silent cap in the engine."""
    engine = LlamaCppEngine({"n_ctx": 50})
    engine._llama = SimpleNamespace(_model=SimpleNamespace(vocab=None))
    engine._ctx = SimpleNamespace(forget=lambda seq_id, start: None)
    sampling = SamplingParams(max_tokens=20, temperature=0)
    engine._start(_Job("r", [1] * 45, sampling, None, lambda item: None), engine._slots[0], 0)
    (sequence,) = engine._running
    assert engine.max_context == 50 and sequence.decoding.limit == 20
