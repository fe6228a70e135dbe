"""Text chunks written from a template are the typed chunks, byte for byte in meaning.

The template path (tritonforge/openai/chunks.py) skips pydantic per chunk; these tests
read what it writes back as the response models and compare it with what the typed
path writes, for text a JSON writer must escape (quotes, backslashes, control
characters, line separators) and multi-byte characters.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.unit.openai.test_openai_translate import (
    USER,
    FakeGateway,
    client,
    conforms,
    sse_events,
)
from tritonforge.openai import translate
from tritonforge.openai.chunks import TextChunks, sse
from tritonforge.openai.responses import (
    ChatCompletionChunk,
    ChoiceDelta,
    CompletionChunk,
    to_json,
)
from tritonforge.openai.translate import ModelOutput, ResponseIds

TEXTS = ['say "hi"', "back\\slash", "tab\tnew\nline\x00\x1f", "\u2028\u2029", "é 🙂 中文", " "]


@pytest.mark.parametrize("with_usage", [False, True])
@pytest.mark.parametrize("chat", [False, True])
def test_a_template_chunk_reads_as_the_typed_chunk(chat: bool, with_usage: bool) -> None:
    ids = ResponseIds("llm", "chatcmpl" if chat else "cmpl")
    chunks = TextChunks(ids, chat, with_usage)
    model = ChatCompletionChunk if chat else CompletionChunk
    for text in TEXTS:
        if chat:
            typed = translate.chat_chunk(ids, ChoiceDelta(content=text), with_usage=with_usage)
        else:
            typed = translate.completion_chunk(ids, text, with_usage=with_usage)
        event = chunks.event(text)
        assert event.startswith(b"data: ") and event.endswith(b"\n\n")
        data = event[6:-2].decode()
        assert conforms(data, model) == json.loads(to_json(typed))


def test_a_model_name_holding_the_marker_falls_back_to_the_typed_chunk() -> None:
    ids = ResponseIds("tritonforge@text@slot", "cmpl")
    event = TextChunks(ids, chat=False, with_usage=False).event("x")
    assert event == sse(to_json(translate.completion_chunk(ids, "x")))


def _streamed(path: str, body: dict[str, Any]) -> list[str]:
    outputs = [ModelOutput(text, "None", 3, 1) for text in TEXTS]
    outputs.append(ModelOutput("!", "length", 3, 1, final=True))
    reply = client(FakeGateway(outputs)).post(path, json={"model": "llm", "stream": True, **body})
    events = sse_events(reply.text)
    assert events[-1] == "[DONE]"
    return events[:-1]


@pytest.mark.parametrize("include_usage", [False, True])
def test_a_streamed_completion_is_typed_chunks_with_the_whole_text(include_usage: bool) -> None:
    body: dict[str, Any] = {"prompt": "x"}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    sent = [conforms(e, CompletionChunk) for e in _streamed("/v1/completions", body)]
    text = "".join(c["choices"][0]["text"] for c in sent if c["choices"])
    assert text == "".join(TEXTS) + "!"
    assert all(("usage" in c) == include_usage for c in sent)


def test_a_streamed_chat_is_typed_chunks_with_the_whole_text() -> None:
    body = {"messages": USER, "stream_options": {"include_usage": True}}
    sent = [conforms(e, ChatCompletionChunk) for e in _streamed("/v1/chat/completions", body)]
    deltas = [c["choices"][0]["delta"] for c in sent if c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(d.get("content", "") for d in deltas) == "".join(TEXTS) + "!"
    assert sent[-1]["usage"]["completion_tokens"] == len(TEXTS) + 1
