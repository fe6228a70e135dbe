"""The C++ tokenizer (through pybind11) gives exactly what HF ``tokenizers`` gives.

Ids for every corpus string (>= 10,000 per tokenizer), decode with and without special
tokens, and the incremental decoder's concatenation for the same ids; plus decoding of
random id sequences, which cut multi-byte characters anywhere and so exercise the U+FFFD
handling of invalid UTF-8.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HfTokenizer

from tests.tokenizers_under_test import tt

TOKENIZERS = ["smollm2", "gpt2", "gpt2_prefix_legacy_merges", "llama3", "llama3_ignore_merges"]


_LOADED: dict[Path, tuple[tt.Tokenizer, HfTokenizer]] = {}


def _pair(files: dict[str, Path], name: str) -> tuple[tt.Tokenizer, HfTokenizer]:
    """Ours and HF's, loaded once per file (both are immutable)."""
    path = files[name]
    if path not in _LOADED:
        _LOADED[path] = tt.Tokenizer.from_file(str(path)), HfTokenizer.from_file(str(path))
    return _LOADED[path]


@pytest.fixture(params=TOKENIZERS)
def pair(
    request: pytest.FixtureRequest, tokenizer_files: dict[str, Path]
) -> tuple[tt.Tokenizer, HfTokenizer]:
    """Ours and HF's, for each tokenizer under test in turn."""
    return _pair(tokenizer_files, request.param)


def _first_mismatches(texts: list, ours: list, theirs: list, limit: int = 5) -> list:
    return [(t, a, b) for t, a, b in zip(texts, ours, theirs, strict=True) if a != b][:limit]


def test_corpus_is_large_enough(corpus: list[str]) -> None:
    assert len(corpus) >= 10_000
    assert any("\u200d" in t for t in corpus) and any("\u3000" in t for t in corpus)


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_matches_hf(
    pair: tuple[tt.Tokenizer, HfTokenizer], corpus: list[str], add_special_tokens: bool
) -> None:
    ours, hf = pair
    expected = [e.ids for e in hf.encode_batch(corpus, add_special_tokens=add_special_tokens)]
    got = ours.encode_batch(corpus, add_special_tokens=add_special_tokens)
    assert got == expected, _first_mismatches(corpus, got, expected)


@pytest.mark.parametrize("skip_special_tokens", [False, True])
def test_decode_and_incremental_decode_match_hf(
    pair: tuple[tt.Tokenizer, HfTokenizer], corpus: list[str], skip_special_tokens: bool
) -> None:
    ours, hf = pair
    ids = [e.ids for e in hf.encode_batch(corpus)]
    expected = hf.decode_batch(ids, skip_special_tokens=skip_special_tokens)
    got = [ours.decode(row, skip_special_tokens=skip_special_tokens) for row in ids]
    assert got == expected, _first_mismatches(ids, got, expected)
    streamed = []
    for row in ids:
        decoder = ours.incremental_decoder(skip_special_tokens=skip_special_tokens)
        streamed.append("".join(decoder.add(i) for i in row) + decoder.finish())
    assert streamed == expected, _first_mismatches(ids, streamed, expected)


@pytest.mark.parametrize("name", ["smollm2", "gpt2", "llama3"])
def test_random_ids_decode_like_hf(tokenizer_files: dict[str, Path], name: str) -> None:
    ours, hf = _pair(tokenizer_files, name)
    rng = random.Random(3)
    size = ours.vocab_size
    rows = [[rng.randrange(size) for _ in range(rng.randint(1, 24))] for _ in range(3000)]
    for skip in (False, True):
        expected = hf.decode_batch(rows, skip_special_tokens=skip)
        assert [ours.decode(r, skip_special_tokens=skip) for r in rows] == expected
        for row, text in zip(rows, expected, strict=True):
            decoder = ours.incremental_decoder(skip_special_tokens=skip)
            pieces = [decoder.add(i) for i in row]
            assert "".join(pieces) + decoder.finish() == text


def test_incremental_decoder_holds_back_partial_characters(
    tokenizer_files: dict[str, Path],
) -> None:
    """A 4-byte emoji split over byte tokens only appears once it is complete."""
    ours, _ = _pair(tokenizer_files, "gpt2")
    byte_ids = ours.encode("😀", add_special_tokens=False)
    decoder = ours.incremental_decoder()
    outputs = [decoder.add(i) for i in byte_ids]
    assert "".join(outputs) == "😀" and outputs[-1].endswith("😀")
    assert all(o == "" for o in outputs[:-1])
    # A sequence cut short is flushed as one U+FFFD, as the full decode would show it.
    decoder = ours.incremental_decoder()
    text = ours.decode(byte_ids[:1])
    assert "".join(decoder.add(i) for i in byte_ids[:1]) == ""
    assert decoder.pending_bytes > 0 and decoder.finish() == text


def test_token_lookup_matches_hf(tokenizer_files: dict[str, Path]) -> None:
    ours, hf = _pair(tokenizer_files, "smollm2")
    assert ours.vocab_size == hf.get_vocab_size()
    for token, token_id in list(hf.get_vocab().items())[:2000]:
        assert ours.token_to_id(token) == token_id
        assert ours.id_to_token(token_id) == hf.id_to_token(token_id)
    assert ours.is_special(hf.token_to_id("<|im_start|>"))
    assert not ours.is_special(hf.token_to_id("Hello"))


def test_merge_forms_give_the_same_ids(tokenizer_files: dict[str, Path], corpus: list[str]) -> None:
    """Legacy "a b" merges and [a, b] pairs load to the same model."""
    import json

    data = json.loads(tokenizer_files["llama3"].read_text())
    legacy = dict(data, model=dict(data["model"]))
    legacy["model"]["merges"] = [" ".join(pair) for pair in data["model"]["merges"]]
    pairs = tt.Tokenizer.from_str(json.dumps(data))
    strings = tt.Tokenizer.from_str(json.dumps(legacy))
    assert strings.encode_batch(corpus[:3000]) == pairs.encode_batch(corpus[:3000])


def test_threads_do_not_change_results(tokenizer_files: dict[str, Path], corpus: list[str]) -> None:
    ours, _ = _pair(tokenizer_files, "smollm2")
    assert ours.encode_batch(corpus, threads=1) == ours.encode_batch(corpus, threads=4)
