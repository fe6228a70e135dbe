"""The objects the API answers with, under OpenAI's field names: the frontend's wire contract.

Every body the frontend sends is one of these models written by :func:`to_json`, and
the tests validate what went out against them, so a change of shape, or a faster way
of writing the same shape, is checked against one definition.

One rule decides between an absent key and a null: a field without a default is always
on the wire (``null`` when None, as OpenAI sends ``"logprobs": null``); a field with a
default is left out unless it was set. So a chunk carries ``usage`` only when the client
asked for ``include_usage`` (null on every chunk but the last), and a delta carries only
what changed. :func:`to_json` applies the rule with ``exclude_unset`` inside pydantic's
serialiser, with no Python code per object.

Numbers are written as ``json.dumps`` writes them, infinities included (a logprob can
be ``-Infinity``), so the wire does not change with the serialiser.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class OpenAIObject(BaseModel):
    """Any body the API sends."""

    # forbid: a key the contract does not name fails validation in the tests.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


def to_json(obj: OpenAIObject) -> bytes:
    """``obj`` as compact UTF-8 JSON, unset defaulted fields left out (the rule above)."""
    return obj.__pydantic_serializer__.to_json(obj, exclude_unset=True)


# --- shared parts ------------------------------------------------------------------------


class CompletionUsage(OpenAIObject):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TopLogprob(OpenAIObject):
    token: str
    logprob: float
    #: The token's UTF-8 bytes (a token may be part of a character).
    bytes: list[int]


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(OpenAIObject):
    content: list[ChatTokenLogprob] | None


class CompletionLogprobs(OpenAIObject):
    """The legacy completion form: parallel lists, one entry per generated token."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    #: Each token's offset into the choice's text (after an echoed prompt).
    text_offset: list[int]


# --- /v1/chat/completions ------------------------------------------------------------------


class Function(OpenAIObject):
    name: str
    #: The arguments as a JSON string (OpenAI's form), not an object.
    arguments: str


class ChatCompletionMessageToolCall(OpenAIObject):
    id: str
    type: Literal["function"]
    function: Function


class AssistantMessage(OpenAIObject):
    role: Literal["assistant"]
    content: str | None
    #: Present only on an answer that calls tools.
    tool_calls: list[ChatCompletionMessageToolCall] | None = None


class ChatChoice(OpenAIObject):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class ChatCompletion(OpenAIObject):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: CompletionUsage | None


class ChoiceDeltaToolCallFunction(OpenAIObject):
    name: str | None = None
    arguments: str | None = None


class ChoiceDeltaToolCall(OpenAIObject):
    """A streamed call: the first delta of a call carries id, type and name."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: ChoiceDeltaToolCallFunction | None = None


class ChoiceDelta(OpenAIObject):
    """What a chunk adds to the message: the role once, then content or tool calls."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ChoiceDeltaToolCall] | None = None


class ChunkChoice(OpenAIObject):
    index: int
    delta: ChoiceDelta
    logprobs: ChatLogprobs | None
    finish_reason: str | None


class ChatCompletionChunk(OpenAIObject):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    #: Empty on the usage-only last chunk.
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None


# --- /v1/completions -----------------------------------------------------------------------


class CompletionChoice(OpenAIObject):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None


class Completion(OpenAIObject):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None


class CompletionChunk(Completion):
    """A streamed completion: OpenAI names it as the whole answer, ``usage`` may be absent."""

    usage: CompletionUsage | None = None


# --- /v1/models and errors -----------------------------------------------------------------


class ModelCard(OpenAIObject):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    #: A LoRA adapter's base model and directory (vLLM's fields; absent for a model).
    parent: str | None = None
    root: str | None = None


class ModelList(OpenAIObject):
    object: Literal["list"]
    data: list[ModelCard]


class ErrorBody(OpenAIObject):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(OpenAIObject):
    error: ErrorBody


# --- /v1/embeddings ------------------------------------------------------------------------


class Embedding(OpenAIObject):
    object: Literal["embedding"]
    index: int
    #: The vector as numbers, or (``encoding_format: base64``) its little-endian float32
    #: bytes in base64, as OpenAI sends it.
    embedding: list[float] | str


class EmbeddingUsage(OpenAIObject):
    """Tokens the engine embedded (no completion tokens: an embedding generates none)."""

    prompt_tokens: int
    total_tokens: int


class CreateEmbeddingResponse(OpenAIObject):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
