"""HF ``tokenizers``-exact byte-level BPE in C++ (the core the Triton ``tokenizer`` backend uses).

Why a second tokenizer next to HF's: the same code serves the Triton C++ backend, so
Python callers (tests, benchmarks, Python-backend models) get bit-identical results to
what the server produces, and parity with HF is checked in one place.

    >>> tok = Tokenizer.from_file("tokenizer.json")
    >>> tok.decode(tok.encode("Hello world"))
    'Hello world'
"""

from tritonforge_tokenizer._core import (
    IncrementalDecoder,
    Tokenizer,
    TokenizerError,
    TokenizerInputError,
    TokenizerLoadError,
)

__all__ = [
    "IncrementalDecoder",
    "Tokenizer",
    "TokenizerError",
    "TokenizerInputError",
    "TokenizerLoadError",
]
