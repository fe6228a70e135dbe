"""OpenAI bodies → the shared request schema's tensors; model outputs → OpenAI objects
(the typed models of :mod:`~tritonforge.openai.responses`).

Pure functions and small dataclasses, no I/O, so every mapping is unit-tested without
a server. The schema is README.md's "Inputs and outputs of every LLM model"; only the
inputs a model's config declares are sent (``ModelSpec``), so a model with fewer
inputs (``ensemble_vllm`` has no ``messages``) gets a 400 that says what it lacks
rather than Triton's "unexpected inference input".
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, TypeVar

from tritonforge.openai import tools
from tritonforge.openai.errors import invalid
from tritonforge.openai.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ResponseFormat,
)
from tritonforge.openai.responses import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessageToolCall,
    ChatLogprobs,
    ChatTokenLogprob,
    ChoiceDelta,
    ChoiceDeltaToolCall,
    ChoiceDeltaToolCallFunction,
    ChunkChoice,
    Completion,
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionUsage,
    Function,
    ModelCard,
    ModelList,
    TopLogprob,
)
from tritonforge.serving import chat
from tritonforge.serving.errors import RequestError
from tritonforge.serving.sampling import MAX_LOGPROBS, STRUCTURED_OPTIONS

#: Body keys passed to the model's ``sampling_parameters`` under the same name: OpenAI's
#: own, then vLLM's extras (its server takes them in the body too).
SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "top_k",
    "min_p",
    "repetition_penalty",
    "ignore_eos",
    "min_tokens",
    "stop_token_ids",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "timeout_s",  # this project's: the request's deadline (docs/reference/requests.md, "Deadlines")
    "slo_ttft_ms",  # this project's: SLOs and priority (docs/features/slo-admission.md)
    "slo_tpot_ms",
    "priority",
)
#: Request headers carrying SLOs (llm-d's names), so a gateway can set them per route;
#: the body's key of the same name wins.
SLO_HEADERS = {"x-slo-ttft-ms": "slo_ttft_ms", "x-slo-tpot-ms": "slo_tpot_ms"}
#: vLLM's older structured-output extras → the schema's ``structured_outputs`` kinds.
_GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}
#: OpenAI's chat roles → the schema's (``developer`` is OpenAI's newer name for system).
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_RETURN_FLAGS = ("return_finish_reason", "return_num_input_tokens", "return_num_output_tokens")
_AT_MOST = re.compile(r"ask for at most (\d+) tokens")


@dataclass(frozen=True)
class ModelSpec:
    """The schema inputs and outputs one Triton model declares (from its config)."""

    name: str
    inputs: frozenset[str]
    outputs: frozenset[str]
    #: Rows one request may carry (0: the model takes no batch dimension).
    max_batch_size: int = 0

    @property
    def is_embedding(self) -> bool:
        """An embedding model: a text prompt in, an ``embedding`` out, in batches."""
        return "text_input" in self.inputs and "embedding" in self.outputs

    @property
    def is_llm(self) -> bool:
        """An LLM model of the shared schema: a text prompt or chat messages, sampling, text.

        The sampling input tells an LLM from the other text models of a repository
        (``guard``: text in, text out; ``preprocessing``: text in, ids out).
        """
        prompt = bool({"text_input", "messages"} & self.inputs)
        return prompt and "sampling_parameters" in self.inputs and "text_output" in self.outputs


@dataclass
class TritonRequest:
    """One request in the shared schema, ready to become tensors."""

    prompt_input: str  # text_input | messages | input_ids
    prompt: str | list[int]
    sampling: dict[str, Any]
    flags: dict[str, bool]
    #: Top candidates per position the client asked for (None: no logprobs).
    top_logprobs: int | None = None
    #: The completion's ``echo``: this text goes before the generated text.
    echo: str = ""
    #: max_tokens was this server's default, not the client's: it may be lowered to fit.
    default_max_tokens: bool = False
    #: What the request's ``tools`` ask of the answer (None: no tools).
    tools: tools.ToolPlan | None = None
    #: The Triton model to send it to when the body's ``model`` names a LoRA adapter.
    triton_model: str | None = None

    def fit_max_tokens(self, message: str) -> bool:
        """Lower a defaulted max_tokens to what the model says fits; False if it cannot."""
        match = _AT_MOST.search(message)
        if not self.default_max_tokens or match is None or int(match.group(1)) < 1:
            return False
        self.sampling["max_tokens"] = int(match.group(1))
        self.default_max_tokens = False
        return True


# --- request translation -------------------------------------------------------------


def apply_slo_headers(request: TritonRequest, headers: Mapping[str, str]) -> None:
    """SLOs sent as headers join the sampling keys the body did not set; the model
    validates them (an error names ``slo_ttft_ms``) as it does the body's."""
    for header, key in SLO_HEADERS.items():
        value = headers.get(header)
        if value is not None and key not in request.sampling:
            request.sampling[key] = value.strip()


def _common(
    body: ChatCompletionRequest | CompletionRequest, spec: ModelSpec, logprobs: int | None
) -> tuple[dict[str, Any], dict[str, bool]]:
    """Sampling keys and return flags both endpoints share."""
    if body.logit_bias:
        raise invalid("logit_bias is not supported by this server", "logit_bias")
    if body.stream_options is not None and not body.stream:
        raise invalid("stream_options: only allowed when stream is true", "stream_options")
    extras = body.model_extra or {}
    values = body.model_dump()  # declared fields and the extras alike
    sampling = {k: values[k] for k in SAMPLING_KEYS if values.get(k) is not None}
    structured = _structured(body.response_format, extras)
    if structured is not None:
        sampling["structured_outputs"] = structured
    if logprobs is not None:
        sampling["logprobs"] = logprobs
    if body.n is not None:  # the model checks it (its engine may sample one sequence only)
        sampling["n"] = body.n
    flags = {"stream": body.stream, "exclude_input_in_output": True}
    flags |= {name: True for name in _RETURN_FLAGS}
    if logprobs is not None:
        if "return_logprobs" not in spec.inputs:
            raise invalid(f"logprobs: the model `{spec.name}` cannot return logprobs", "logprobs")
        flags |= {"return_logprobs": True}
        # The sampled token's id picks its entry; one sequence's ids fit one tensor only.
        flags |= {"return_output_ids": True} if (body.n or 1) == 1 else {}
    return sampling, {k: v for k, v in flags.items() if k in spec.inputs}


def _structured(response_format: ResponseFormat | None, extras: Mapping[str, Any]) -> Any:
    """``response_format`` (or vLLM's extras) as the schema's ``structured_outputs``.

    As vLLM's server does, ``response_format`` sets the constraint over the request's
    ``structured_outputs``, whose options (``disable_any_whitespace``) still apply: a
    client can ask an OpenAI-style JSON answer to be compact.
    """
    given = extras.get("structured_outputs")
    if response_format is not None and response_format.type != "text":
        options = (
            {k: v for k, v in given.items() if k in STRUCTURED_OPTIONS}
            if isinstance(given, dict)
            else {}
        )
        if response_format.type == "json_object":
            return {**options, "json_object": True}
        spec = response_format.json_schema
        if spec is None or spec.json_schema is None:
            raise invalid(
                "response_format.json_schema.schema: required for type json_schema",
                "response_format",
            )
        return {**options, "json": spec.json_schema}
    if given is not None:
        return given
    for key, kind in _GUIDED.items():
        if extras.get(key) is not None:
            return {kind: extras[key]}
    return None


def _count(name: str, value: Any) -> int:
    """A number of top candidates per position (the schema's ``logprobs`` range)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LOGPROBS:
        raise invalid(f"{name}: must be an integer in [0, {MAX_LOGPROBS}], got {value!r}", name)
    return value


def _message(index: int, message: ChatMessage) -> dict[str, Any]:
    """One message as the model's ``messages`` input takes it; tool turns keep their shape."""
    where = f"messages[{index}]"
    extras = message.model_extra or {}
    if extras.get("function_call"):
        raise invalid(f"{where}.function_call: not supported; use tool_calls", "messages")
    role = "tool" if message.role == "tool" else _ROLES.get(message.role)
    if role is None:
        raise invalid(
            f"{where}.role: must be one of {', '.join(_ROLES)}, tool; got {message.role!r}",
            "messages",
        )
    content = message.content
    if isinstance(content, list):
        if any(part.type != "text" or part.text is None for part in content):
            raise invalid(f"{where}.content: only text parts are supported", "messages")
        content = "".join(part.text or "" for part in content)
    raw: dict[str, Any] = {"role": role, "content": content}
    raw |= {"name": message.name} if message.name else {}
    raw |= {key: extras[key] for key in ("tool_calls", "tool_call_id") if extras.get(key)}
    try:  # the model's own rules for tool turns, answered here as a 400
        return chat.check_message(where, raw)
    except RequestError as exc:
        raise invalid(str(exc), "messages") from None


def chat_request(
    body: ChatCompletionRequest, spec: ModelSpec, default_max_tokens: int | None
) -> TritonRequest:
    """A chat body as the ``messages`` input (rendered by the model's chat template)."""
    if "messages" not in spec.inputs:
        raise invalid(
            f"model `{spec.name}` takes no chat messages (no `messages` input); "
            "use /v1/completions",
            "model",
        )
    plan = tools.plan(body.tools, body.tool_choice)
    if plan is not None and plan.active and (body.n or 1) != 1:
        raise invalid(f"n: tool calls are answered one choice at a time, got {body.n}", "n")
    top = None
    if body.logprobs:
        top = 0 if body.top_logprobs is None else _count("top_logprobs", body.top_logprobs)
    elif body.top_logprobs is not None:
        raise invalid("top_logprobs: requires logprobs to be true", "top_logprobs")
    sampling, flags = _common(body, spec, top)
    requested = (
        body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    )
    defaulted = requested is None and default_max_tokens is not None
    if requested is not None:
        sampling["max_tokens"] = requested
    elif defaulted:
        sampling["max_tokens"] = default_max_tokens
    messages: Any = [_message(i, m) for i, m in enumerate(body.messages)]
    if plan is not None and plan.active:
        messages = {"messages": messages, "tools": plan.declared()}
        _constrain(plan, sampling)
    return TritonRequest(
        "messages",
        json.dumps(messages, ensure_ascii=False),
        sampling,
        flags,
        top_logprobs=top,
        default_max_tokens=defaulted,
        tools=plan if plan is not None and plan.active else None,
    )


def _constrain(plan: tools.ToolPlan, sampling: dict[str, Any]) -> None:
    """A forced answer (``required`` or a named tool) is generated as one call object."""
    if plan.mode == "forced":
        if "structured_outputs" in sampling:
            raise invalid(
                "response_format: cannot be combined with a required or named tool_choice",
                "response_format",
            )
        # Compact: a forced call has no free whitespace to spend its tokens on, so its
        # length is bounded by the allowed names and the tools' schemas.
        sampling["structured_outputs"] = {"json": plan.structured(), "disable_any_whitespace": True}


def completion_request(body: CompletionRequest, spec: ModelSpec) -> TritonRequest:
    """A completion body: a string → ``text_input``, token ids → ``input_ids``."""
    prompt: Any = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise invalid(
                f"prompt: one prompt per request is supported, got {len(prompt)}", "prompt"
            )
        prompt = prompt[0]
    if body.suffix:
        raise invalid("suffix is not supported by this server", "suffix")
    if body.best_of is not None and body.best_of != 1:
        raise invalid(f"best_of: only 1 is supported, got {body.best_of}", "best_of")
    if isinstance(prompt, str):
        prompt_input = "text_input"
    else:
        prompt_input = "input_ids"
        if not prompt:
            raise invalid("prompt: must not be empty", "prompt")
        if body.echo:
            raise invalid("echo: only supported for a string prompt", "echo")
    if prompt_input not in spec.inputs:
        what = "a string prompt" if prompt_input == "text_input" else "token ids"
        raise invalid(f"model `{spec.name}` takes no {what} (no `{prompt_input}` input)", "prompt")
    logprobs = None if body.logprobs is None else _count("logprobs", body.logprobs)
    sampling, flags = _common(body, spec, logprobs)
    if body.max_tokens is not None:
        sampling["max_tokens"] = body.max_tokens
    return TritonRequest(
        prompt_input,
        prompt,
        sampling,
        flags,
        top_logprobs=logprobs,
        echo=prompt if body.echo and isinstance(prompt, str) else "",
    )


# --- model outputs ---------------------------------------------------------------------


@dataclass
class ModelOutput:
    """One response of the model (a delta when streaming, the whole answer otherwise)."""

    text: str = ""
    finish_reason: str | None = None
    num_input_tokens: int | None = None
    num_output_tokens: int | None = None
    #: Per output position: token id (as a string, JSON's keys) → its logprob entry.
    logprobs: list[dict[str, dict[str, Any]]] | None = None
    output_ids: list[int] | None = None
    final: bool = False
    #: A response of an n > 1 request: one output per sequence, in index order (the
    #: counts above are then the response's: the prompt's, and the sequences' sum).
    choices: list[ModelOutput] | None = None


@dataclass
class Usage:
    """Token counts summed over a request's responses (what the model reports)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def add(self, output: ModelOutput) -> None:
        if output.num_input_tokens is not None:
            self.prompt_tokens = output.num_input_tokens
        if output.num_output_tokens is not None:
            self.completion_tokens = (self.completion_tokens or 0) + output.num_output_tokens

    def report(self) -> CompletionUsage | None:
        if self.prompt_tokens is None or self.completion_tokens is None:
            return None  # the model cannot count: no made-up numbers
        return CompletionUsage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            total_tokens=self.prompt_tokens + self.completion_tokens,
        )


def finish_reason(raw: str | None) -> str | None:
    """The model's finish reason as OpenAI's: ``None`` (the string) on a non-final delta."""
    if raw is None or raw in ("None", ""):
        return None
    return raw if raw in ("stop", "length") else "stop" if raw == "abort" else raw


def _positions(output: ModelOutput) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(sampled token's entry, all candidates by rank) per position.

    The sampled token is the output id at that position when the model returns ids, else
    the first candidate (engines list the sampled token first, as vLLM does).
    """
    result = []
    for i, candidates in enumerate(output.logprobs or []):
        if not candidates:
            continue
        ids = output.output_ids
        sampled_key = str(ids[i]) if ids is not None and i < len(ids) else next(iter(candidates))
        sampled = candidates.get(sampled_key) or next(iter(candidates.values()))
        ranked = sorted(candidates.values(), key=lambda c: c.get("rank") or 1 << 30)
        result.append((sampled, ranked))
    return result


def _token(entry: Mapping[str, Any]) -> str:
    return entry.get("decoded_token") or ""


def _top(entry: Mapping[str, Any]) -> TopLogprob:
    token = _token(entry)
    return TopLogprob(token=token, logprob=entry["logprob"], bytes=list(token.encode("utf-8")))


def chat_logprobs(output: ModelOutput, top: int) -> ChatLogprobs:
    """OpenAI's chat ``logprobs``: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""
    content = []
    for sampled, ranked in _positions(output):
        token = _token(sampled)
        content.append(
            ChatTokenLogprob(
                token=token,
                logprob=sampled["logprob"],
                bytes=list(token.encode("utf-8")),
                top_logprobs=[_top(c) for c in ranked[:top]],
            )
        )
    return ChatLogprobs(content=content)


def completion_logprobs(output: ModelOutput, text_offset: int) -> CompletionLogprobs:
    """OpenAI's legacy completion ``logprobs``: parallel lists, offsets into the text."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    offsets: list[int] = []
    offset = text_offset
    for sampled, ranked in _positions(output):
        token = _token(sampled)
        tokens.append(token)
        token_logprobs.append(sampled["logprob"])
        top_logprobs.append({_token(c): c["logprob"] for c in ranked})
        offsets.append(offset)
        offset += len(token)
    return CompletionLogprobs(
        tokens=tokens, token_logprobs=token_logprobs, top_logprobs=top_logprobs, text_offset=offsets
    )


# --- response objects ----------------------------------------------------------------


class Envelope(TypedDict):
    """The keys every answer and chunk opens with (``object`` names the kind of body)."""

    id: str
    object: str
    created: int
    model: str


@dataclass
class ResponseIds:
    """What every object of one response shares: id, creation time, model."""

    model: str
    prefix: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.id = self.id or f"{self.prefix}-{uuid.uuid4().hex}"

    def envelope(self, kind: str) -> Envelope:
        """The opening keys of one body of this response.

        Built here for every kind of body, so all chunks of a stream and its usage chunk
        carry the same id, time and model, which clients rely on to join a stream into
        one answer; the response models still check ``kind`` against OpenAI's literal.
        """
        return Envelope(id=self.id, object=kind, created=self.created, model=self.model)


def tool_calls(calls: Sequence[tools.ToolCall]) -> list[ChatCompletionMessageToolCall]:
    """Calls as the answer's ``message.tool_calls``."""
    return [
        ChatCompletionMessageToolCall(
            id=c.id, type="function", function=Function(name=c.name, arguments=c.arguments)
        )
        for c in calls
    ]


def chat_completion(
    ids: ResponseIds,
    text: str | None,
    reason: str | None,
    logprobs: ChatLogprobs | None,
    usage: Usage,
    calls: Sequence[tools.ToolCall] = (),
) -> ChatCompletion:
    message = AssistantMessage(role="assistant", content=text)
    if calls:
        message.tool_calls = tool_calls(calls)
    choice = ChatChoice(index=0, message=message, logprobs=logprobs, finish_reason=reason)
    return ChatCompletion(**ids.envelope("chat.completion"), choices=[choice], usage=usage.report())


def chat_chunk(
    ids: ResponseIds,
    delta: ChoiceDelta,
    reason: str | None = None,
    logprobs: ChatLogprobs | None = None,
    with_usage: bool = False,
    index: int = 0,
) -> ChatCompletionChunk:
    choice = ChunkChoice(index=index, delta=delta, logprobs=logprobs, finish_reason=reason)
    chunk = ChatCompletionChunk(**ids.envelope("chat.completion.chunk"), choices=[choice])
    return _null_usage(chunk) if with_usage else chunk


def tool_call_chunks(
    ids: ResponseIds,
    content: str | None,
    calls: Sequence[tools.ToolCall],
    with_usage: bool,
    reason: str = "tool_calls",
) -> list[ChatCompletionChunk]:
    """A tool-calling answer's chunks, as OpenAI streams them: any content, then per call
    a delta with its id, type and name, then one with its arguments, then the finish
    (``reason``: see :attr:`ToolPlan.calls_finish_reason`)."""
    chunks = []
    if content:
        chunks.append(chat_chunk(ids, ChoiceDelta(content=content), with_usage=with_usage))
    for i, call in enumerate(calls):
        head = ChoiceDeltaToolCall(
            index=i,
            id=call.id,
            type="function",
            function=ChoiceDeltaToolCallFunction(name=call.name, arguments=""),
        )
        body = ChoiceDeltaToolCall(
            index=i, function=ChoiceDeltaToolCallFunction(arguments=call.arguments)
        )
        for part in (head, body):
            chunks.append(chat_chunk(ids, ChoiceDelta(tool_calls=[part]), with_usage=with_usage))
    chunks.append(chat_chunk(ids, ChoiceDelta(), reason, with_usage=with_usage))
    return chunks


def chat_completion_of_choices(
    ids: ResponseIds, choices: Sequence[ChatChoice], usage: Usage
) -> ChatCompletion:
    """An answer of n > 1 choices (each made as :func:`chat_completion` makes one)."""
    return ChatCompletion(
        **ids.envelope("chat.completion"), choices=list(choices), usage=usage.report()
    )


def completion_of_choices(
    ids: ResponseIds, choices: Sequence[CompletionChoice], usage: Usage
) -> Completion:
    """A completion of n > 1 choices."""
    return Completion(
        **ids.envelope("text_completion"), choices=list(choices), usage=usage.report()
    )


def completion(
    ids: ResponseIds,
    text: str,
    reason: str | None,
    logprobs: CompletionLogprobs | None,
    usage: Usage,
) -> Completion:
    choice = CompletionChoice(index=0, text=text, logprobs=logprobs, finish_reason=reason)
    return Completion(**ids.envelope("text_completion"), choices=[choice], usage=usage.report())


def completion_chunk(
    ids: ResponseIds,
    text: str,
    reason: str | None = None,
    logprobs: CompletionLogprobs | None = None,
    with_usage: bool = False,
    index: int = 0,
) -> CompletionChunk:
    choice = CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=reason)
    chunk = CompletionChunk(**ids.envelope("text_completion"), choices=[choice])
    return _null_usage(chunk) if with_usage else chunk


_Chunk = TypeVar("_Chunk", ChatCompletionChunk, CompletionChunk)


def _null_usage(chunk: _Chunk) -> _Chunk:
    """Mark ``usage`` set (so written as null): OpenAI's way on every chunk but the last."""
    chunk.usage = None
    return chunk


def usage_chunk(
    ids: ResponseIds, chat: bool, usage: Usage
) -> ChatCompletionChunk | CompletionChunk:
    """The last chunk of a stream with ``include_usage``: no choices, the usage."""
    if chat:
        return ChatCompletionChunk(
            **ids.envelope("chat.completion.chunk"), choices=[], usage=usage.report()
        )
    return CompletionChunk(**ids.envelope("text_completion"), choices=[], usage=usage.report())


def model_list(names: Sequence[str], created: int) -> ModelList:
    cards = [
        ModelCard(id=n, object="model", created=created, owned_by="tritonforge") for n in names
    ]
    return ModelList(object="list", data=cards)
