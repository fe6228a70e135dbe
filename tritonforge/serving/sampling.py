"""One sampling vocabulary for every engine.

Clients send sampling keys as a JSON string (the ``sampling_parameters`` tensor, as
upstream vllm_backend does) or as Triton request parameters. Tools are loose about
types — genai-perf sends ``"max_tokens": "256"`` — so numbers and booleans may come as
strings, but anything that is not exactly a value of the right type and range is
rejected with the key's name and the rule. Each engine adapter maps the typed
:class:`SamplingParams` onto its own call; nothing else in the project parses keys.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tritonforge.serving.errors import RequestError

STRUCTURED_KINDS = ("json", "regex", "choice", "grammar", "json_object")
MAX_STOP_STRINGS = 16
MAX_LOGPROBS = 20
#: ``priority`` lies in [-PRIORITY_LIMIT, PRIORITY_LIMIT]: bounded so that engines with a
#: bounded scale (TensorRT-LLM's [0, 1]) can map it without clipping.
PRIORITY_LIMIT = 100
#: Sequences one request may ask for, at most: a request holds one place of the model's
#: ``max_inflight`` however many it asks for, so the bound is this project's own.
MAX_N = 128


#: Options that may stand beside the kind (vLLM's names).
STRUCTURED_OPTIONS = ("disable_any_whitespace",)


@dataclass(frozen=True)
class StructuredOutput:
    """A constraint on the generated text: exactly one kind with its value.

    ``disable_any_whitespace`` (``json``/``json_object`` only) asks for JSON without
    free whitespace between tokens (a small greedy model can spend its whole budget on
    newlines). llama.cpp honours it; vLLM 0.32 reads only its engine-wide setting.
    """

    kind: str
    value: Any
    disable_any_whitespace: bool = False


@dataclass(frozen=True)
class SamplingParams:
    """Engine-agnostic sampling settings; defaults follow vLLM's (max_tokens 16)."""

    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutput | None = None
    n: int = 1
    #: Seconds the request may run before it is aborted (None: no limit). A request
    #: limit rather than a sampling knob: it lives here because clients send it with
    #: the sampling keys, so one vocabulary validates it. The runtime enforces it;
    #: engine adapters ignore it.
    timeout_s: float | None = None
    #: The LoRA adapter to answer with (None: the base model). A request setting like
    #: ``timeout_s``, kept here so the ``lora_name`` key and tensor are validated by one
    #: vocabulary; :meth:`Engine.prepare` checks it names an adapter the model serves.
    lora_name: str | None = None
    #: Service-level objectives in milliseconds (None: none). Request settings like
    #: ``timeout_s``: the runtime's SLO admission (serving/admission.py) may refuse a
    #: request it predicts would miss its time to first token, or whose admission would
    #: slow the requests running beside it past their time per output token.
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    #: Scheduling priority, lower first (vLLM's direction; 0 is the default). Engines
    #: that cannot order their queue refuse any other value rather than ignore it.
    priority: int = 0

    def seed_or_random(self) -> int:
        """The client's seed, else a fresh one for this request.

        Unseeded requests differ from each other in vLLM; engines that would fall back
        to a fixed or a reused seed (TensorRT-LLM's 0, llama.cpp's context seed) use
        this so that they vary the same way.
        """
        return self.seed if self.seed is not None else random.getrandbits(63)


# --- value coercion: each returns the typed value or raises RequestError ---------


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise RequestError(name, f"expected an integer, got a boolean ({value})")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise RequestError(name, f"expected an integer, got {value!r}")


def _as_float(name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise RequestError(name, f"expected a number, got a boolean ({value})")
    result: float | None = None
    if isinstance(value, int | float):
        result = float(value)
    elif isinstance(value, str):
        try:
            result = float(value.strip())
        except ValueError:
            result = None
    if result is None:
        raise RequestError(name, f"expected a number, got {value!r}")
    if not math.isfinite(result):
        raise RequestError(name, f"must be a finite number, got {value!r}")
    return result


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise RequestError(name, f"expected true or false, got {value!r}")


def _as_stop(name: str, value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise RequestError(name, f"expected a string or a list of strings, got {value!r}")
    if any(s == "" for s in items):
        raise RequestError(name, "stop strings must not be empty")
    if len(items) > MAX_STOP_STRINGS:
        raise RequestError(name, f"at most {MAX_STOP_STRINGS} stop strings, got {len(items)}")
    return tuple(items)


def _as_adapter_name(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise RequestError(name, f"expected an adapter name (a string), got {value!r}")
    if not value.strip():
        raise RequestError(name, "must name an adapter; omit it to use the base model")
    return value


def _as_token_ids(name: str, value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise RequestError(name, f"expected a list of token ids, got {value!r}")
    ids = tuple(_as_int(f"{name}[{i}]", v) for i, v in enumerate(value))
    for i, token in enumerate(ids):
        if token < 0:
            raise RequestError(f"{name}[{i}]", f"token ids must be >= 0, got {token}")
    return ids


def _json_in_text(where: str, value: Any, problem: str) -> Any:
    """``value``, or the JSON it spells when it is a string; bad JSON names ``where``."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise RequestError(where, f"{problem}: {exc.msg}") from None


def _as_structured(name: str, value: Any) -> StructuredOutput:
    value = _json_in_text(name, value, "expected a JSON object")
    if not isinstance(value, dict):
        raise RequestError(name, f"expected an object with one of {STRUCTURED_KINDS}")
    kinds = [k for k in value if k in STRUCTURED_KINDS]
    unknown = sorted(set(value) - set(STRUCTURED_KINDS) - set(STRUCTURED_OPTIONS))
    if unknown:
        raise RequestError(
            f"{name}.{unknown[0]}",
            f"unknown key; use one of {STRUCTURED_KINDS} (options: {STRUCTURED_OPTIONS})",
        )
    compact = value.get("disable_any_whitespace", False)
    if not isinstance(compact, bool):
        raise RequestError(f"{name}.disable_any_whitespace", "expected true or false")
    if len(kinds) != 1:
        raise RequestError(name, f"give exactly one of {STRUCTURED_KINDS}, got {kinds or 'none'}")
    kind = kinds[0]
    spec = value[kind]
    where = f"{name}.{kind}"
    if kind == "json":
        spec = _json_in_text(where, spec, "not valid JSON")
        if not isinstance(spec, dict):
            raise RequestError(where, "expected a JSON schema object")
    elif kind in ("regex", "grammar"):
        if not isinstance(spec, str) or not spec:
            raise RequestError(where, "expected a non-empty string")
    elif kind == "choice":
        if not isinstance(spec, list) or not spec or not all(isinstance(c, str) for c in spec):
            raise RequestError(where, "expected a non-empty list of strings")
    elif spec is not True:
        raise RequestError(where, "expected true")
    if compact and kind not in ("json", "json_object"):
        raise RequestError(
            f"{name}.disable_any_whitespace", f"applies to json and json_object, not {kind}"
        )
    return StructuredOutput(kind, spec, compact)


# --- the vocabulary: key -> (coercion, rule check or None, rule text) ------------
#
# The one table of ranges every engine is held to: each is the tightest any engine of
# this project accepts (vLLM's own checks where it is the strictest: temperature at most
# 2, top_p above 0), so a value is refused alike by every engine, before any engine sees
# it, with the key's name. docs/compatibility.md lists it.

Check = Callable[[Any], bool] | None
_SPECS: dict[str, tuple[Callable[[str, Any], Any], Check, str]] = {
    "max_tokens": (_as_int, lambda v: v >= 1, "must be >= 1"),
    "min_tokens": (_as_int, lambda v: v >= 0, "must be >= 0"),
    "temperature": (_as_float, lambda v: 0.0 <= v <= 2.0, "must be in [0, 2]"),
    "top_p": (_as_float, lambda v: 0.0 < v <= 1.0, "must be in (0, 1]"),
    "top_k": (_as_int, lambda v: v >= -1, "must be -1 or 0 (disabled) or a positive integer"),
    "min_p": (_as_float, lambda v: 0.0 <= v <= 1.0, "must be in [0, 1]"),
    "presence_penalty": (_as_float, lambda v: -2.0 <= v <= 2.0, "must be in [-2, 2]"),
    "frequency_penalty": (_as_float, lambda v: -2.0 <= v <= 2.0, "must be in [-2, 2]"),
    "repetition_penalty": (_as_float, lambda v: 0.0 < v <= 2.0, "must be in (0, 2]"),
    "seed": (_as_int, lambda v: 0 <= v < 2**63, "must be in [0, 2^63)"),
    "stop": (_as_stop, None, ""),
    "stop_token_ids": (_as_token_ids, None, ""),
    "ignore_eos": (_as_bool, None, ""),
    "logprobs": (_as_int, lambda v: 0 <= v <= MAX_LOGPROBS, f"must be in [0, {MAX_LOGPROBS}]"),
    "skip_special_tokens": (_as_bool, None, ""),
    "include_stop_str_in_output": (_as_bool, None, ""),
    "structured_outputs": (_as_structured, None, ""),
    "n": (_as_int, lambda v: 1 <= v <= MAX_N, f"must be in [1, {MAX_N}]"),
    "timeout_s": (_as_float, lambda v: v > 0, "must be a positive number of seconds"),
    "lora_name": (_as_adapter_name, None, ""),
    "slo_ttft_ms": (_as_float, lambda v: v > 0, "must be a positive number of milliseconds"),
    "slo_tpot_ms": (_as_float, lambda v: v > 0, "must be a positive number of milliseconds"),
    "priority": (
        _as_int,
        lambda v: -PRIORITY_LIMIT <= v <= PRIORITY_LIMIT,
        f"must be an integer in [-{PRIORITY_LIMIT}, {PRIORITY_LIMIT}] (lower runs first)",
    ),
}
# Older vllm_backend clients spell structured output ``guided_decoding``.
_ALIASES = {"guided_decoding": "structured_outputs"}
ACCEPTED_KEYS = tuple(sorted(_SPECS))
#: Every sampling key, longest first: an engine's message naming ``top_p`` is not about ``p``.
SAMPLING_KEYS = tuple(sorted(_SPECS, key=len, reverse=True))


def range_rules() -> dict[str, str]:
    """Every key's range rule (keys without a range left out), as errors word it.

    docs/compatibility.md lists them; a unit test holds the page to this table.
    """
    return {key: rule for key, (_, check, rule) in _SPECS.items() if check is not None}


def parse_sampling_value(key: str, raw_value: Any, name: str) -> Any:
    """Validate one value of the vocabulary's ``key``; errors name ``name``.

    Engine dialects that carry a sampling key in a tensor of its own (TensorRT-LLM's
    ``sampling_param_top_p``) use this so the error names the tensor the client sent.
    """
    coerce, check, rule = _SPECS[key]
    value = coerce(name, raw_value)
    if check is not None and not check(value):
        raise RequestError(name, f"{rule}, got {raw_value!r}")
    return value


def parse_sampling(values: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Validate raw key/values from ``source``; return typed values keyed by field name."""
    typed: dict[str, Any] = {}
    for raw_key, raw_value in values.items():
        key = _ALIASES.get(raw_key, raw_key)
        name = f"{source}.{raw_key}"
        if key not in _SPECS:
            raise RequestError(
                name, f"unknown sampling parameter; accepted: {', '.join(ACCEPTED_KEYS)}"
            )
        if raw_value is None:
            continue  # JSON null means "use the default", as in OpenAI-style APIs
        typed[key] = parse_sampling_value(key, raw_value, name)
    return typed


def build_sampling(*layers: Mapping[str, Any]) -> SamplingParams:
    """Merge typed layers (later wins) and check rules that span several keys."""
    merged: dict[str, Any] = {}
    for layer in layers:
        merged.update(layer)
    params = SamplingParams(**merged)
    if params.min_tokens > params.max_tokens:
        raise RequestError(
            "sampling_parameters.min_tokens",
            f"must be <= max_tokens ({params.max_tokens}), got {params.min_tokens}",
        )
    return params


def decode_json_object(raw: str | bytes, source: str) -> dict[str, Any]:
    """Parse a JSON object sent as a string; errors name ``source``."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError(source, "is not valid UTF-8") from None
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise RequestError(source, f"is not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(value, dict):
        raise RequestError(source, f"must be a JSON object, got {type(value).__name__}")
    return value
