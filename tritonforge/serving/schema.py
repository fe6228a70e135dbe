"""The request schema: raw Triton inputs in, one typed :class:`GenerateRequest` out.

Tensor names and defaults follow upstream vllm_backend so its clients (and genai-perf
``--backend vllm``) work unchanged; ``messages`` (chat) and ``input_ids`` (token-level
ensembles) are this project's additions. Parsing is pure — numpy arrays and a
parameters mapping — so it is unit-tested without a server, and every rule that fails
names the input or key it concerns.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from tritonforge.serving.chat import Messages, Tools, parse_chat
from tritonforge.serving.errors import RequestError
from tritonforge.serving.sampling import (
    SamplingParams,
    build_sampling,
    decode_json_object,
    parse_sampling,
    parse_sampling_value,
)

PROMPT_INPUTS = ("text_input", "messages", "input_ids")
# Parameters that Triton's frontends use for transport; they are not sampling keys.
# ``priority`` is not among them: where it reaches the model as a request parameter
# (HTTP ``/generate``) it is the sampling key of that name, honoured or refused by the
# engine like the tensor's (docs/compatibility.md says where Triton keeps it).
# ``traceparent`` is a request's W3C trace context (docs/tracing.md): every model must
# accept it, the OpenAI frontend sends it to whichever model it serves. ``id`` is
# ``/generate``'s request id: Triton 2.51 takes it as the request's id and passes it on
# as a parameter too.
TRANSPORT_PARAMETERS = frozenset(
    {
        "binary_data_output",
        "id",
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "timeout",
        "traceparent",
    }
)


@dataclass(frozen=True)
class ReturnFlags:
    """Optional outputs a client asked for (``return_<name>`` inputs)."""

    finish_reason: bool = False
    cumulative_logprob: bool = False
    logprobs: bool = False
    num_input_tokens: bool = False
    num_output_tokens: bool = False
    output_ids: bool = False


RETURN_INPUTS = tuple(f"return_{name}" for name in ReturnFlags.__dataclass_fields__)


@dataclass(frozen=True)
class GenerateRequest:
    """A validated generation request; exactly one of the three prompt forms is set."""

    prompt: str | None = None
    messages: Messages | None = None
    #: The functions a chat request declares (``{"messages": …, "tools": …}``).
    tools: Tools = ()
    prompt_ids: tuple[int, ...] | None = None
    stream: bool = False
    prepend_input: bool = False
    sampling: SamplingParams = field(default_factory=SamplingParams)
    returns: ReturnFlags = field(default_factory=ReturnFlags)


def _single(name: str, array: npt.NDArray[Any]) -> Any:
    if array.size != 1:
        raise RequestError(name, f"expected exactly one element, got shape {tuple(array.shape)}")
    return array.reshape(-1)[0]


def _text(name: str, array: npt.NDArray[Any]) -> str:
    value = _single(name, array)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RequestError(name, f"is not valid UTF-8 (byte {exc.start})") from None
    if isinstance(value, str):
        return value
    raise RequestError(name, f"expected a string (BYTES), got {array.dtype}")


def _flag(name: str, array: npt.NDArray[Any]) -> bool:
    value = _single(name, array)
    if isinstance(value, bool | np.bool_):
        return bool(value)
    raise RequestError(name, f"expected a BOOL tensor, got {array.dtype}")


def _token_ids(array: npt.NDArray[Any]) -> tuple[int, ...]:
    if array.dtype.kind not in "iu":
        raise RequestError("input_ids", f"expected INT32 or INT64 token ids, got {array.dtype}")
    ids = array.reshape(-1)
    if ids.size == 0:
        raise RequestError("input_ids", "must hold at least one token id")
    if (ids < 0).any():
        raise RequestError("input_ids", f"token ids must be >= 0, got {int(ids.min())}")
    return tuple(int(t) for t in ids)


_Prompt = tuple[str | None, tuple[Messages, Tools] | None, tuple[int, ...] | None]


def parse_request(
    inputs: Mapping[str, npt.NDArray[Any]],
    parameters: Mapping[str, Any] | None = None,
    dialect_sampling: Mapping[str, Any] | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> GenerateRequest:
    """Build a :class:`GenerateRequest` from input tensors and request parameters.

    Sampling keys may come as request parameters and in the ``sampling_parameters``
    tensor; when both name a key, the tensor wins (it is the more explicit channel).
    ``dialect_sampling`` holds typed values an engine's input dialect already read
    from tensors of their own (see :meth:`Engine.translate_inputs`); they rank
    between request parameters and the ``sampling_parameters`` tensor. ``defaults`` are
    the model's own typed values (config.pbtxt ``default_<key>`` parameters): every
    channel of the request outranks them.

    The parts are read in a fixed order (prompt, echo, returns, sampling), so a request
    with several mistakes always reports the same one first.
    """
    prompt, chat, prompt_ids = _prompt(inputs)
    stream, prepend_input = _echo(inputs, text_prompt=prompt is not None)
    returns = _returns(inputs, token_level=prompt_ids is not None)
    sampling = _sampling(inputs, parameters, dialect_sampling, defaults=defaults)
    if sampling.n > 1 and returns.output_ids:
        raise RequestError(
            "return_output_ids",
            f"one tensor holds the ids of one sequence; with n = {sampling.n} set it false",
        )
    return GenerateRequest(
        prompt=prompt,
        messages=chat[0] if chat else None,
        tools=chat[1] if chat else (),
        prompt_ids=prompt_ids,
        stream=stream,
        prepend_input=prepend_input,
        sampling=sampling,
        returns=returns,
    )


def _prompt(inputs: Mapping[str, npt.NDArray[Any]]) -> _Prompt:
    """The one prompt form given: (text, chat messages, token ids), the others None."""
    given = [name for name in PROMPT_INPUTS if name in inputs]
    if len(given) != 1:
        raise RequestError(
            "text_input",
            f"give exactly one of {', '.join(PROMPT_INPUTS)}; got {', '.join(given) or 'none'}",
        )
    if "text_input" in inputs:
        prompt = _text("text_input", inputs["text_input"])
        if not prompt.strip():
            raise RequestError("text_input", "must not be empty")
        return prompt, None, None
    if "messages" in inputs:
        return None, parse_chat(_text("messages", inputs["messages"])), None
    return None, None, _token_ids(inputs["input_ids"])


def _echo(inputs: Mapping[str, npt.NDArray[Any]], text_prompt: bool) -> tuple[bool, bool]:
    """``(stream, prepend_input)``: whether to stream, and whether to echo the prompt.

    Upstream semantics: a non-streamed text prompt is echoed before the output unless
    exclude_input_in_output is set; streaming never echoes and refuses to be asked to.
    """
    stream = _flag("stream", inputs["stream"]) if "stream" in inputs else False
    if "exclude_input_in_output" in inputs:
        exclude = _flag("exclude_input_in_output", inputs["exclude_input_in_output"])
        if stream and not exclude:
            raise RequestError(
                "exclude_input_in_output", "must be true (or omitted) when stream is true"
            )
    else:
        exclude = stream
    return stream, text_prompt and not exclude


def _returns(inputs: Mapping[str, npt.NDArray[Any]], token_level: bool) -> ReturnFlags:
    """The ``return_<name>`` flags a client set, with this project's one default.

    Token ids in, token ids out: a token-level caller (an ensemble's LLM step, whose
    inputs come only from the ensemble's tensors) gets output_ids unless it opts out.
    """
    flags = {
        name.removeprefix("return_"): _flag(name, inputs[name])
        for name in RETURN_INPUTS
        if name in inputs
    }
    flags.setdefault("output_ids", token_level)
    return ReturnFlags(**flags)


def _sampling(
    inputs: Mapping[str, npt.NDArray[Any]],
    parameters: Mapping[str, Any] | None,
    dialect_sampling: Mapping[str, Any] | None,
    defaults: Mapping[str, Any] | None = None,
) -> SamplingParams:
    """Merge the three sampling channels, lowest rank first (see :func:`parse_request`).

    ``return_logprobs`` asks for no logprobs by itself: without a ``logprobs`` count the
    output is ``null``, as vllm_backend answers (its clients test for it).
    The ``lora_name`` tensor ranks just below the ``sampling_parameters`` tensor.
    """
    params = {k: v for k, v in (parameters or {}).items() if k not in TRANSPORT_PARAMETERS}
    from_params = parse_sampling(params, "parameters")
    from_tensor: dict[str, Any] = {}
    if "sampling_parameters" in inputs:
        raw = _text("sampling_parameters", inputs["sampling_parameters"])
        from_tensor = parse_sampling(
            decode_json_object(raw, "sampling_parameters"), "sampling_parameters"
        )
    layers = (
        dict(defaults or {}),
        from_params,
        dict(dialect_sampling or {}),
        _lora_tensor(inputs, from_tensor),
        from_tensor,
    )
    return build_sampling(*layers)


def _lora_tensor(
    inputs: Mapping[str, npt.NDArray[Any]], from_tensor: Mapping[str, Any]
) -> dict[str, Any]:
    """The adapter the ``lora_name`` input names (upstream vllm_backend's tensor), if sent.

    A client that names two different adapters (the tensor and the ``sampling_parameters``
    key) made a mistake either way: refuse rather than pick one silently.
    """
    if "lora_name" not in inputs:
        return {}
    name = parse_sampling_value("lora_name", _text("lora_name", inputs["lora_name"]), "lora_name")
    other = from_tensor.get("lora_name")
    if other is not None and other != name:
        raise RequestError(
            "lora_name",
            f"names adapter {name!r} but sampling_parameters.lora_name names {other!r}; "
            "send one of them",
        )
    return {"lora_name": name}
