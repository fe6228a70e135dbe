"""Exact text deltas from token bytes: UTF-8 splits, stop strings, hold-back."""

from __future__ import annotations

import random

import pytest

from tritonforge.engines.text_stream import StopStringMatcher, TextStream


def run(pieces: list[bytes], stops: tuple[str, ...] = (), include: bool = False):
    stream = TextStream(stops, include)
    deltas = []
    for piece in pieces:
        delta = stream.add(piece)
        deltas.append(delta.text)
        if delta.stop is not None:
            return deltas, delta.stop
    end = stream.finish()
    deltas.append(end.text)
    return deltas, end.stop


def test_multibyte_character_split_across_tokens_is_emitted_once_whole() -> None:
    euro = "€".encode()  # three bytes
    deltas, stop = run([b"a", euro[:1], euro[1:2], euro[2:], b"b"])
    assert deltas == ["a", "", "", "€", "b", ""]
    assert stop is None


def test_incomplete_character_at_the_end_becomes_a_replacement_character() -> None:
    deltas, _ = run([b"ok", "é".encode()[:1]])
    assert "".join(deltas) == "ok\ufffd"


def test_stop_string_ends_the_text_and_is_left_out() -> None:
    deltas, stop = run([b"Hello", b" wor", b"ld!", b" more"], stops=("world",))
    assert stop == "world"
    assert "".join(deltas) == "Hello "


def test_stop_string_kept_when_asked() -> None:
    deltas, stop = run([b"Hello", b" wor", b"ld!"], stops=("world",), include=True)
    assert stop == "world" and "".join(deltas) == "Hello world"


def test_possible_stop_prefix_is_held_back_then_released() -> None:
    stream = TextStream(("STOP",))
    assert stream.add(b"abc ST").text == "abc "
    assert stream.add(b"AR").text == "STAR"  # it did not become a stop string
    assert stream.add(b"S").text == ""
    assert stream.finish().text == "S"


def test_earliest_stop_string_wins() -> None:
    matcher = StopStringMatcher(("b", "a"), include_stop=False)
    assert matcher.feed("xab") == ("x", "a")


@pytest.mark.parametrize("seed", range(20))
def test_any_split_of_the_bytes_gives_the_same_text(seed: int) -> None:
    rng = random.Random(seed)
    text = "Grüße, 世界! 🙂 The END is near. ÉÑD"
    data = text.encode()
    cuts = sorted(rng.sample(range(1, len(data)), 12))
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    whole, _ = run([data], stops=("END", "🙂 x"))
    split, _ = run(pieces, stops=("END", "🙂 x"))
    assert "".join(split) == "".join(whole) == "Grüße, 世界! 🙂 The "
