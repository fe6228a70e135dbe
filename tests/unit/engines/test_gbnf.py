"""Structured outputs as llama.cpp grammars (needs llama-cpp-python, no model)."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp")

from tritonforge.engines.gbnf import structured_gbnf
from tritonforge.serving.errors import RequestError
from tritonforge.serving.sampling import StructuredOutput


def test_choice_is_a_gbnf_alternation_with_escapes() -> None:
    grammar = structured_gbnf(StructuredOutput("choice", ['say "hi"', "back\\slash", "new\nline"]))
    assert grammar == 'root ::= "say \\"hi\\"" | "back\\\\slash" | "new\\nline"'


def test_regex_is_matched_whole() -> None:
    grammar = structured_gbnf(StructuredOutput("regex", "^[0-9]{2}$"))
    assert grammar.startswith("root ::= ")
    assert '"\\""' not in grammar  # a raw pattern, not a JSON string


def test_json_schema_becomes_a_grammar() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert "root ::=" in structured_gbnf(StructuredOutput("json", schema))


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        ("regex", "(?=a)b"),  # look-arounds: no grammar equivalent
        ("regex", "a(b"),  # malformed
        ("json", {"$ref": "https://example.invalid/schema.json"}),  # no fetching
    ],
)
def test_what_llama_cpp_cannot_express_is_a_request_error_naming_the_kind(kind, value) -> None:
    with pytest.raises(RequestError) as info:
        structured_gbnf(StructuredOutput(kind, value))
    assert info.value.field == f"sampling_parameters.structured_outputs.{kind}"


def test_disable_any_whitespace_empties_the_whitespace_rule() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    loose = structured_gbnf(StructuredOutput("json", schema))
    compact = structured_gbnf(StructuredOutput("json", schema, disable_any_whitespace=True))
    assert 'space ::= ""' in compact.splitlines() and 'space ::= ""' not in loose.splitlines()
    json_object = structured_gbnf(StructuredOutput("json_object", True, True))
    assert 'ws ::= ""' in json_object.splitlines()
