"""Exact text deltas for engines whose native output is token ids.

vLLM detokenizes and matches stop strings itself. TensorRT-LLM detokenizes, but its
adapter matches stop strings on the text with :class:`StopStringMatcher` (the engine
trims a stop string only at the end of a stream, and matches on token ids). llama.cpp
hands back one token at a time, as raw bytes: :class:`TextStream` turns those bytes
into text deltas. Either way the client gets the same guarantees:

* a multi-byte UTF-8 character split across tokens is emitted whole, once complete
  (an incomplete tail at the end of generation becomes U+FFFD, as in vLLM);
* a stop string ends the text (left out unless ``include_stop``), and text that
  could still turn into a stop string is held back until it cannot, so a streamed
  answer never shows a stop string that the non-streamed answer leaves out;
* concatenating every delta gives exactly the final text.

Pure Python, unit-tested without an engine.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tritonforge.engines.base import EngineOutput, PositionLogprobs
from tritonforge.serving.sampling import SamplingParams


class StopStringMatcher:
    """Finds the first stop string in streamed text, holding back possible prefixes."""

    def __init__(self, stops: Sequence[str], include_stop: bool) -> None:
        self._stops = tuple(stops)
        self._include = include_stop
        self._pending = ""

    def feed(self, text: str) -> tuple[str, str | None]:
        """Add ``text``; return the text that is now safe to emit and the stop hit, if any."""
        if not self._stops:
            return text, None
        self._pending += text
        hit: tuple[int, str] | None = None
        for stop in self._stops:
            at = self._pending.find(stop)
            if at >= 0 and (hit is None or at < hit[0]):
                hit = (at, stop)
        if hit is not None:
            at, stop = hit
            emitted = self._pending[: at + (len(stop) if self._include else 0)]
            self._pending = ""
            return emitted, stop
        hold = self._longest_partial_stop()
        cut = len(self._pending) - hold
        emitted, self._pending = self._pending[:cut], self._pending[cut:]
        return emitted, None

    def flush(self) -> str:
        """Generation ended without a stop string: release what was held back."""
        emitted, self._pending = self._pending, ""
        return emitted

    def _longest_partial_stop(self) -> int:
        """Length of the longest suffix of the pending text that starts a stop string."""
        best = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(stop[:size]):
                    best = size
                    break
        return best


@dataclass
class TextDelta:
    """What one token added: text safe to emit, and the stop string if one was hit."""

    text: str
    stop: str | None = None


class TextStream:
    """Token bytes in, exact text deltas out (UTF-8 safe, stop strings applied)."""

    def __init__(self, stops: Sequence[str] = (), include_stop: bool = False) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = StopStringMatcher(stops, include_stop)

    def add(self, piece: bytes) -> TextDelta:
        """Add one token's bytes."""
        text, stop = self._stops.feed(self._decoder.decode(piece))
        return TextDelta(text, stop)

    def finish(self) -> TextDelta:
        """Generation ended: flush a partial character and the held-back text."""
        tail, stop = self._stops.feed(self._decoder.decode(b"", final=True))
        if stop is not None:
            return TextDelta(tail, stop)
        return TextDelta(tail + self._stops.flush())


@dataclass
class TokenDecoding:
    """One request's text and progress, for engines that sample one token id at a time.

    ``pieces`` holds every token's bytes (special tokens as the request wants them
    rendered) and ``ends_generation`` flags the end-of-generation ids: both are tables
    the engine reads once, so a token costs list lookups.
    """

    params: SamplingParams
    pieces: Sequence[bytes]
    ends_generation: Sequence[bool] | npt.NDArray[np.bool_]
    stream: TextStream
    limit: int  # max_tokens; Engine.prepare already checked it fits the context
    generated: int = 0
    cumulative_logprob: float | None = None

    def advance(self, token: int) -> tuple[str, str | None]:
        """Count ``token``; the text it adds and, if it ends the request, why."""
        self.generated += 1
        params, piece = self.params, self.pieces[token]
        is_stop_token = token in params.stop_token_ids
        if self.ends_generation[token] or is_stop_token:
            # An end token adds no text (as in vLLM) unless it is a stop token the
            # client asked to see.
            text = ""
            if is_stop_token and params.include_stop_str_in_output:
                text = self.stream.add(piece).text
            return text + self.stream.finish().text, "stop"
        delta = self.stream.add(piece)
        if delta.stop is not None:
            return delta.text, "stop"
        if self.generated >= self.limit:
            end = self.stream.finish()
            return delta.text + end.text, "stop" if end.stop is not None else "length"
        return delta.text, None

    def output(
        self, token: int, logprob: tuple[PositionLogprobs, float] | None = None
    ) -> EngineOutput:
        """The delta for one sampled token: its text, its logprobs (the position's entry
        and the chosen token's logprob, when asked for) and whether it ends the request."""
        logprobs = None
        if logprob is not None:
            entry, chosen = logprob
            logprobs = [entry]
            self.cumulative_logprob = (self.cumulative_logprob or 0.0) + chosen
        text, reason = self.advance(token)
        return EngineOutput(
            text=text,
            token_ids=[token],
            logprobs=logprobs,
            cumulative_logprob=self.cumulative_logprob,
            finished=reason is not None,
            finish_reason=reason,
        )

    def forbids_end(self) -> bool:
        """End tokens may not be sampled yet (ignore_eos, or min_tokens not reached)."""
        return self.params.ignore_eos or self.generated < self.params.min_tokens
