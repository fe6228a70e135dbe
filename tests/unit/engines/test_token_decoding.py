"""Sampled token ids become text deltas and finish reasons (llama.cpp, synthetic; no model)."""

from __future__ import annotations

import numpy as np

from tritonforge.engines.text_stream import TextStream, TokenDecoding
from tritonforge.serving.sampling import SamplingParams

# Token 0 ends generation; 1-3 are text ("é" is split over 2 and 3).
PIECES = [b"</s>", b"ab", "é".encode()[:1], "é".encode()[1:]]
ENDS = np.array([True, False, False, False])


def decode(tokens: list[int], limit: int = 10, **sampling) -> list[tuple[str, str | None]]:
    params = SamplingParams(**sampling)
    stream = TextStream(params.stop, params.include_stop_str_in_output)
    decoding = TokenDecoding(params, PIECES, ENDS, stream, limit)
    return [decoding.advance(t) for t in tokens]


def test_text_is_released_whole_and_the_end_token_adds_none() -> None:
    assert decode([1, 2, 3, 0]) == [("ab", None), ("", None), ("é", None), ("", "stop")]


def test_the_limit_finishes_with_length_and_flushes() -> None:
    assert decode([1, 2], limit=2) == [("ab", None), ("\ufffd", "length")]


def test_a_stop_token_shows_only_when_asked() -> None:
    assert decode([1], stop_token_ids=(1,)) == [("", "stop")]
    shown = decode([1], stop_token_ids=(1,), include_stop_str_in_output=True)
    assert shown == [("ab", "stop")]


def test_a_stop_string_ends_the_text() -> None:
    assert decode([1, 1], stop=("ba",)) == [("a", None), ("", "stop")]
