"""The request bodies of ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/embeddings``.

Pydantic checks the *structure* a translation relies on (a model name, messages with
roles, a prompt of a known form, a response format). Sampling values are deliberately
left untyped: the model validates them with the same rules for every client and a
message that names the field (``sampling_parameters.top_p: must be in (0, 1], got
1.5``), and two validators that could disagree would be worse than one.

Unknown keys are allowed, as OpenAI's and vLLM's servers allow them (``user``,
``metadata``, ``store``, …): they are ignored, except vLLM's sampling extras, which the
translation passes on.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class StreamOptions(_Open):
    include_usage: bool = False


class JsonSchemaFormat(_Open):
    name: str | None = None
    description: str | None = None
    # ``schema`` would shadow a BaseModel attribute: keep the wire name as an alias.
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Open):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ContentPart(_Open):
    type: str
    text: str | None = None


class ChatMessage(_Open):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None


class _Request(_Open):
    """Keys both endpoints share."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    max_tokens: Any = None
    temperature: Any = None
    top_p: Any = None
    stop: Any = None
    seed: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    logit_bias: dict[str, Any] | None = None
    response_format: ResponseFormat | None = None


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Any = None
    logprobs: bool | None = None
    top_logprobs: Any = None
    tools: list[Any] | None = None
    tool_choice: Any = None


class CompletionRequest(_Request):
    # A string, token ids, or OpenAI's batch forms (one prompt is served per request).
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: Any = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None


class EmbeddingRequest(_Open):
    """``/v1/embeddings``: ``input`` is checked by the translation (its messages name
    ``input`` and the item), so it is any JSON here."""

    model: str
    input: Any = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Any = None
