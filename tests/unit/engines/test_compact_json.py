"""Compact JSON as an xgrammar grammar: what vLLM and TensorRT-LLM are sent when a
request asks for ``disable_any_whitespace`` (neither takes it per request)."""

from __future__ import annotations

import xgrammar
from vllm.sampling_params import StructuredOutputsParams

from tritonforge.engines.compact_json import compact_json_grammar
from tritonforge.engines.vllm import to_vllm_sampling
from tritonforge.serving.sampling import SamplingParams, StructuredOutput

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def accepts(grammar: str, text: str) -> bool:
    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo(["a"]))
    compiled = compiler.compile_grammar(xgrammar.Grammar.from_ebnf(grammar))
    return xgrammar.GrammarMatcher(compiled).accept_string(text)


def test_the_grammar_takes_compact_json_and_nothing_looser() -> None:
    for kind, value in (("json", SCHEMA), ("json", '{"type": "object"}'), ("json_object", True)):
        grammar = compact_json_grammar(kind, value)
        assert accepts(grammar, '{"a": 1}')
        assert not accepts(grammar, '{ "a": 1}') and not accepts(grammar, '{"a":\n1}')
    assert not accepts(compact_json_grammar("json", SCHEMA), '{"b": 1}')  # still the schema


def test_vllm_gets_a_grammar_for_compact_json_and_the_kind_otherwise() -> None:
    compact = StructuredOutput("json", SCHEMA, disable_any_whitespace=True)
    sent = to_vllm_sampling(SamplingParams(structured_outputs=compact)).structured_outputs
    assert isinstance(sent, StructuredOutputsParams) and sent.json is None
    assert sent.grammar == compact_json_grammar("json", SCHEMA)
    loose = StructuredOutput("json", SCHEMA)
    sent = to_vllm_sampling(SamplingParams(structured_outputs=loose)).structured_outputs
    assert sent is not None and sent.json == SCHEMA and sent.grammar is None
