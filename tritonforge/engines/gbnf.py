"""Structured outputs as llama.cpp grammars (GBNF), for the llama.cpp adapter.

llama.cpp constrains generation with a GBNF grammar only, so every structured-output
kind becomes one: ``json`` (a JSON schema) and ``regex`` through llama.cpp's own
schema/regex converter, ``choice`` as an alternation of literals, ``json_object`` as
llama.cpp's JSON grammar, and ``grammar`` taken as GBNF. Whatever cannot become a
grammar is the client's error, named by the structured-output kind.
"""

from __future__ import annotations

import re
from typing import Any

import llama_cpp
from llama_cpp.llama_grammar import JSON_GBNF, SchemaConverter

from tritonforge.serving.errors import RequestError
from tritonforge.serving.sampling import StructuredOutput

STRUCTURED_FIELD = "sampling_parameters.structured_outputs"


def _gbnf_literal(text: str) -> str:
    escaped = (
        text.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\t", "\\t")
    )
    return f'"{escaped}"'


def _regex_gbnf(pattern: str) -> str:
    """A regular expression (matched whole, as in vLLM) as a GBNF grammar."""
    pattern = pattern.removeprefix("^")
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1]
    converter = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=True)
    converter.visit({"type": "string", "pattern": f"^{pattern}$"}, "")
    grammar: str = converter.format_grammar()
    return grammar


def _compact(grammar: str, rule: str, spec: StructuredOutput) -> str:
    """With ``disable_any_whitespace``, the grammar's whitespace rule matches nothing."""
    if not spec.disable_any_whitespace:
        return grammar
    lines = [
        f'{rule} ::= ""' if line.startswith(f"{rule} ") else line for line in grammar.splitlines()
    ]
    return "\n".join(lines) + "\n"


def structured_gbnf(spec: StructuredOutput) -> str:
    """GBNF text for a structured-output constraint; RequestError names what failed.

    ``json`` (a JSON schema) and ``regex`` go through llama.cpp's own schema/regex to
    grammar converter; ``grammar`` is taken as GBNF, llama.cpp's grammar language
    (vLLM's ``grammar`` is EBNF/Lark: the same key, another language).
    """
    where = f"{STRUCTURED_FIELD}.{spec.kind}"
    try:
        if spec.kind == "json":
            converter = SchemaConverter(
                prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False
            )
            schema = converter.resolve_refs(spec.value, "request")
            converter.visit(schema, "")
            grammar: str = converter.format_grammar()
            return _compact(grammar, "space", spec)
        if spec.kind == "json_object":
            return _compact(JSON_GBNF, "ws", spec)
        if spec.kind == "regex":
            re.compile(spec.value)  # the converter accepts some malformed patterns
            return _regex_gbnf(spec.value)
        if spec.kind == "choice":
            return "root ::= " + " | ".join(_gbnf_literal(c) for c in spec.value)
        given: str = spec.value  # grammar: GBNF as given (a string, checked by the schema)
        return given
    except Exception as exc:  # the converters raise assorted errors on input they reject
        raise RequestError(where, f"llama.cpp cannot turn this into a grammar: {exc}") from None


def checked_grammar(spec: StructuredOutput, vocab: Any) -> str:
    """GBNF text for ``spec``, checked against the model's vocabulary."""
    text = structured_gbnf(spec)
    # llama.cpp returns NULL for a grammar it cannot parse, and adding NULL to a
    # sampler chain crashes: check it here, where a bad grammar is the client's error.
    probe = llama_cpp.llama_sampler_init_grammar(vocab, text.encode("utf-8"), b"root")
    if not probe:
        raise RequestError(
            f"{STRUCTURED_FIELD}.{spec.kind}", "llama.cpp could not parse the grammar"
        )
    llama_cpp.llama_sampler_free(probe)
    return text
