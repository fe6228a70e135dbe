"""The bytes of a streamed answer's text chunks, written from a template of the typed chunk.

Almost every chunk of a stream carries only new text (no finish reason, no logprobs),
and two such chunks differ only in that text. So, once per stream, the typed chunk
(:mod:`tritonforge.openai.responses`) is written with a marker where the text goes and
cut there; each text chunk is then the two halves around the text encoded by msgspec —
about 1 µs, where building and writing the pydantic chunk costs 12 to 18 µs, once per
streamed response. Every other chunk (the role, the last one, logprobs, usage, errors)
is written from its typed model. The tests read both kinds back as the same models.
"""

from __future__ import annotations

import msgspec

from tritonforge.openai import translate
from tritonforge.openai.responses import (
    ChatCompletionChunk,
    ChoiceDelta,
    CompletionChunk,
    to_json,
)
from tritonforge.openai.translate import ResponseIds

#: Stands for the text while the template is cut; plain ASCII, so every JSON writer
#: writes it the same way.
_MARK = "tritonforge@text@slot"
_MARK_JSON = b'"' + _MARK.encode() + b'"'
_encode = msgspec.json.Encoder().encode


def sse(data: bytes) -> bytes:
    """One server-sent event carrying ``data``."""
    return b"data: " + data + b"\n\n"


class TextChunks:
    """Text-only chunks of one stream (chat or completion) as SSE events."""

    def __init__(self, ids: ResponseIds, chat: bool, with_usage: bool) -> None:
        self._ids, self._chat, self._with_usage = ids, chat, with_usage
        raw = sse(to_json(self._typed(_MARK)))
        # A model name holding the marker would cut the template in the wrong place.
        self._halves = raw.split(_MARK_JSON) if raw.count(_MARK_JSON) == 1 else None

    def _typed(self, text: str) -> ChatCompletionChunk | CompletionChunk:
        if self._chat:
            return translate.chat_chunk(
                self._ids, ChoiceDelta(content=text), with_usage=self._with_usage
            )
        return translate.completion_chunk(self._ids, text, with_usage=self._with_usage)

    def event(self, text: str) -> bytes:
        """The SSE event of a chunk adding ``text``, and nothing else, to the answer."""
        if self._halves is None:
            return sse(to_json(self._typed(text)))
        head, tail = self._halves
        return head + _encode(text) + tail
