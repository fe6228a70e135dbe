"""Compact JSON as a grammar, for engines whose per-request options cannot ask for it.

A JSON grammar that allows any whitespace between tokens lets a small greedy model fill
its whole budget with newlines, so ``structured_outputs.disable_any_whitespace`` asks for
JSON without free whitespace. vLLM 0.32 reads that switch only from its engine-wide
configuration and TensorRT-LLM's LLM API has none; both decode grammars with xgrammar
and take its EBNF, so the compact JSON grammar is written by xgrammar itself and sent
as a ``grammar`` constraint. (llama.cpp builds its own GBNF: :mod:`gbnf`.)
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any


def compact_json_grammar(kind: str, value: Any) -> str:
    """EBNF for JSON without free whitespace: the schema's (``json``) or any object
    (``json_object``)."""
    schema = {"type": "object"} if kind == "json_object" else value
    return _grammar(schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True))


@lru_cache(maxsize=256)
def _grammar(schema: str) -> str:
    import xgrammar  # the grammar library of both engines' guided decoding

    return str(xgrammar.Grammar.from_json_schema(schema, any_whitespace=False))
