"""TensorRT-LLM adapter (LLM API, PyTorch backend): the only module that uses tensorrt_llm.

Configuration is ``model.yaml`` in upstream's llmapi Triton model format: every key but
``triton_config`` goes to ``tensorrt_llm.LLM(**kwargs)``; ``triton_config`` holds the
Triton-side settings. Each request runs as ``LLM.generate_async(..., streaming=True)``;
the engine returns cumulative :class:`CompletionOutput` objects whose ``text_diff`` /
``token_ids_diff`` are the deltas the core streams. A cancelled client aborts the
request (``RequestOutput.abort()``); unloading shuts the LLM down.

``tensorrt_llm`` is imported when the model loads, not when this module is imported:
it initialises CUDA on import (upstream defers it for the same reason), and where it is
missing the load must fail with a message that says so rather than a bare traceback.
The LLM API is a class attribute (:attr:`TensorRTLLMEngine.llm_api`), which is also how
the contract test (tests/contract) drives the adapter against a stand-in of the
documented API.

Clients of upstream's model and of genai-perf ``--backend tensorrtllm`` are served by
the Triton edge's :mod:`tritonforge.serving.dialects.tensorrtllm`; the adapter sees only parsed
requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import re
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from tritonforge.engines.base import (
    ConfigFile,
    EngineOutput,
    EngineStats,
    HFTokenizedEngine,
    PositionLogprobs,
    PreparedPrompt,
    RequestTracker,
    TokenLogprob,
    stop_on_thread,
)
from tritonforge.engines.compact_json import compact_json_grammar
from tritonforge.engines.lora import LORA_FILE, LoraAdapter
from tritonforge.engines.text_stream import StopStringMatcher
from tritonforge.serving.sampling import PRIORITY_LIMIT, SamplingParams

# --- the LLM API, loaded at model load ---------------------------------------------


@dataclass(frozen=True)
class LlmApi:
    """The names of the LLM API the adapter uses (the LoRA pair only for LoRA models)."""

    LLM: Any
    SamplingParams: Any
    GuidedDecodingParams: Any
    LoRARequest: Any = None  # tensorrt_llm.executor.request.LoRARequest
    LoraConfig: Any = None  # tensorrt_llm.lora_manager.LoraConfig


def load_llm_api() -> LlmApi:
    """Import TensorRT-LLM's LLM API, or fail with a message saying what is missing."""
    try:
        trtllm = importlib.import_module("tensorrt_llm")
        sampling = importlib.import_module("tensorrt_llm.sampling_params")
    except ImportError as exc:
        raise RuntimeError(
            "tensorrt_llm_model needs TensorRT-LLM, which is not importable here "
            f"({exc}). It runs on NVIDIA GPUs: use the NGC image "
            "nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3 (see docker/Dockerfile.trtllm)."
        ) from None
    lora_request = lora_config = None
    with contextlib.suppress(ImportError):  # only a model with multi_lora.json needs them
        lora_request = importlib.import_module("tensorrt_llm.executor.request").LoRARequest
        lora_config = importlib.import_module("tensorrt_llm.lora_manager").LoraConfig
    return LlmApi(
        trtllm.LLM, trtllm.SamplingParams, sampling.GuidedDecodingParams, lora_request, lora_config
    )


# --- model.yaml ----------------------------------------------------------------------

#: triton_config keys and what this project does with them.
TRITON_CONFIG_KEYS = ("decoupled", "max_batch_size", "cancellation_check_period_ms")


def split_model_yaml(config: Mapping[str, Any]) -> tuple[dict[str, Any], float]:
    """``model.yaml`` → (``LLM(**kwargs)`` arguments, cancellation poll interval in s).

    The core always streams and batches inside the engine, so ``decoupled`` must be
    true and ``max_batch_size`` 0 when given (upstream's defaults differ; saying so at
    load beats a model that silently behaves otherwise).
    """
    llm_kwargs = {k: v for k, v in config.items() if k != "triton_config"}
    triton = config.get("triton_config") or {}
    if not isinstance(triton, Mapping):
        raise ValueError("model.yaml: triton_config must be a mapping")
    unknown = sorted(set(triton) - set(TRITON_CONFIG_KEYS))
    if unknown:
        raise ValueError(
            f"model.yaml: triton_config.{unknown[0]} is not supported; "
            f"use {', '.join(TRITON_CONFIG_KEYS)}"
        )
    if "decoupled" in triton and triton["decoupled"] is not True:
        raise ValueError(
            "model.yaml: triton_config.decoupled must be true (tritonforge models stream; "
            "a non-streamed request gets one final response)"
        )
    if int(triton.get("max_batch_size", 0)) != 0:
        raise ValueError(
            "model.yaml: triton_config.max_batch_size must be 0 (the engine batches in flight)"
        )
    period_ms = int(triton.get("cancellation_check_period_ms", 100))
    if period_ms <= 0:
        raise ValueError("model.yaml: triton_config.cancellation_check_period_ms must be > 0")
    if "model" not in llm_kwargs:
        raise ValueError("model.yaml: `model` (HF model directory or name) is required")
    return llm_kwargs, period_ms / 1000.0


# --- sampling and outputs ------------------------------------------------------------

#: TensorRT-LLM finish reasons in the common vocabulary (vLLM's).
FINISH_REASONS = {"stop": "stop", "length": "length", "cancelled": "abort", "timeout": "abort"}


def to_trtllm_sampling(api: LlmApi, params: SamplingParams) -> Any:
    """Map the common vocabulary onto ``tensorrt_llm.SamplingParams`` (one sequence).

    TensorRT-LLM decodes greedily when neither top_k nor top_p is set and uses seed 0
    when none is given; the common vocabulary samples by default and draws a fresh
    seed per request, so both are made explicit here.
    """
    guided = None
    if params.structured_outputs is not None:
        kind, value = params.structured_outputs.kind, params.structured_outputs.value
        if params.structured_outputs.disable_any_whitespace:  # json or json_object only
            guided = api.GuidedDecodingParams(grammar=compact_json_grammar(kind, value))
        elif kind == "choice":
            guided = api.GuidedDecodingParams(regex="|".join(re.escape(c) for c in value))
        elif kind == "json_object":
            guided = api.GuidedDecodingParams(json_object=True)
        else:  # json schema, regex, grammar (EBNF) map one to one
            guided = api.GuidedDecodingParams(**{kind: value})
    greedy = params.temperature == 0.0
    return api.SamplingParams(
        n=1,
        max_tokens=params.max_tokens,
        min_tokens=params.min_tokens or None,
        temperature=None if greedy else params.temperature,
        top_k=1 if greedy else (params.top_k if params.top_k > 0 else None),
        top_p=None if greedy else params.top_p,
        min_p=params.min_p or None,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty,
        seed=params.seed_or_random(),
        stop=list(params.stop) or None,
        stop_token_ids=list(params.stop_token_ids) or None,
        # The adapter cuts stop strings itself (see TensorRTLLMEngine.generate).
        include_stop_str_in_output=True,
        ignore_eos=params.ignore_eos,
        # The LLM API returns no logprobs for 0; vLLM's 0 means "the sampled token".
        logprobs=None if params.logprobs is None else max(1, params.logprobs),
        skip_special_tokens=params.skip_special_tokens,
        guided_decoding=guided,
    )


#: TensorRT-LLM's request priority when none is asked for (executor ``Request``'s default).
TRTLLM_DEFAULT_PRIORITY = 0.5


def to_trtllm_priority(priority: int) -> float:
    """The common ``priority`` (lower first, in [-PRIORITY_LIMIT, PRIORITY_LIMIT], 0 default)
    on TensorRT-LLM's scale (higher first, in [0, 1], 0.5 default): reversed and scaled,
    so -PRIORITY_LIMIT → 1.0 (first), 0 → 0.5, PRIORITY_LIMIT → 0.0 (last)."""
    return TRTLLM_DEFAULT_PRIORITY - priority / (2 * PRIORITY_LIMIT)


def _takes_priority(llm: Any) -> bool:
    """Whether this TensorRT-LLM's ``generate_async`` accepts a request priority."""
    try:
        return "priority" in inspect.signature(llm.generate_async).parameters
    except (TypeError, ValueError):
        return False


def _abort_unfinished(result: Any) -> None:
    if not result.finished:
        result.abort()


class TensorRTLLMEngine(HFTokenizedEngine):
    metric_prefix = "trtllm"
    config_file = ConfigFile("model.yaml", path_keys=("model", "tokenizer"))

    #: The LLM API; None imports TensorRT-LLM's when the model loads.
    llm_api: ClassVar[LlmApi | None] = None

    def __init__(self, llm_kwargs: dict[str, Any], api: LlmApi, cancellation_poll_s: float) -> None:
        self._kwargs = llm_kwargs
        self._api = api
        self.cancellation_poll_s = cancellation_poll_s
        self._llm: Any = None
        self._fatal: str | None = None  # the LLM API's background failure, once seen
        self._requests: RequestTracker[Any] = RequestTracker(release=_abort_unfinished)
        self._lora_requests: dict[str, Any] = {}

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> TensorRTLLMEngine:
        llm_kwargs, cancellation_poll_s = split_model_yaml(settings)
        return cls(llm_kwargs, cls.llm_api or load_llm_api(), cancellation_poll_s)

    def serve_adapters(self, adapters: tuple[LoraAdapter, ...]) -> None:
        """LoRA through the LLM API: ``lora_config`` for the LLM, a ``LoRARequest`` per adapter.

        ``model.yaml`` may hold ``lora_config`` keys of its own (``max_loras``,
        ``max_cpu_loras``, ``lora_target_modules`` …); the adapter directories come from
        ``multi_lora.json`` and the rank limit defaults to the largest adapter's.
        """
        api = self._api
        if api.LoRARequest is None or api.LoraConfig is None:
            raise ValueError(
                f"{LORA_FILE}: this TensorRT-LLM has no LoRA API (LoRARequest, LoraConfig)"
            )
        own = self._kwargs.get("lora_config") or {}
        if not isinstance(own, Mapping):
            raise ValueError("model.yaml: lora_config must be a mapping of LoraConfig fields")
        if "lora_dir" in own:
            raise ValueError(
                f"model.yaml: lora_config.lora_dir is set from {LORA_FILE}; list adapters there"
            )
        settings = {
            "max_lora_rank": max(a.rank for a in adapters),
            "max_loras": len(adapters),
            "max_cpu_loras": len(adapters),
            **own,
            "lora_dir": [str(a.path) for a in adapters],
        }
        self._kwargs["lora_config"] = api.LoraConfig(**settings)
        self.adapters = {a.name: a for a in adapters}
        self._lora_requests = {
            a.name: api.LoRARequest(a.name, a.int_id, str(a.path)) for a in adapters
        }

    async def start(self) -> None:
        # generate_async binds results to the running loop, so the LLM is built off-loop
        # but used only from it.
        self._llm = await asyncio.to_thread(lambda: self._api.LLM(**self._kwargs))
        self._tokenizer = self._llm.tokenizer
        if self._tokenizer is None:
            raise RuntimeError("model.yaml: the model needs a tokenizer (skip_tokenizer_init off)")
        max_seq_len = self._kwargs.get("max_seq_len") or getattr(
            self._llm.args, "max_seq_len", None
        )
        if not isinstance(max_seq_len, int) or max_seq_len <= 0:
            raise RuntimeError("model.yaml: set max_seq_len (the context the engine serves)")
        self._max_context = max_seq_len
        self._vocab_size = len(getattr(self._tokenizer, "tokenizer", self._tokenizer))
        self.priority_unsupported = (
            None
            if _takes_priority(self._llm)
            else "this TensorRT-LLM's generate_async takes no request priority"
        )

    async def shutdown(self) -> None:
        for result in self._requests.handles():
            _abort_unfinished(result)
        llm, self._llm = self._llm, None
        await stop_on_thread(llm, lambda llm: llm.shutdown())

    def _logprobs(self, completion: Any) -> list[PositionLogprobs] | None:
        entries = completion.logprobs_diff
        if not entries:
            return None
        result = []
        for sampled, entry in zip(completion.token_ids_diff, entries, strict=False):
            # PyTorch flow: {token: Logprob(logprob, rank)}; TensorRT flow: one bare float.
            candidates = (
                {t: (lp.logprob, lp.rank) for t, lp in entry.items()}
                if isinstance(entry, Mapping)
                else {sampled: (float(entry), None)}
            )
            result.append(
                {
                    token: TokenLogprob(
                        logprob=logprob, rank=rank, decoded_token=self._tokenizer.decode([token])
                    )
                    for token, (logprob, rank) in candidates.items()
                }
            )
        return result

    async def generate(
        self, request_id: str, prompt: PreparedPrompt, sampling: SamplingParams
    ) -> AsyncIterator[EngineOutput]:
        assert self._llm is not None, "engine not started"
        # Only a non-default priority is passed: prepare() refused one this API cannot take.
        extra = {"priority": to_trtllm_priority(sampling.priority)} if sampling.priority else {}
        result = self._llm.generate_async(
            {"prompt_token_ids": list(prompt.token_ids)},
            sampling_params=to_trtllm_sampling(self._api, sampling),
            lora_request=None
            if sampling.lora_name is None
            else self._lora_requests[sampling.lora_name],
            streaming=True,
            **extra,
        )
        # TensorRT-LLM streams text up to a stop string and trims it only at the end, so
        # a streamed answer could show text the final one lacks; and it matches stop
        # strings on token ids, missing one tokenised differently. The core's matcher
        # on the text holds back possible stop prefixes and cuts exactly, as for the
        # other engines; the engine is asked to keep stop strings so text only grows.
        stops = StopStringMatcher(sampling.stop, sampling.include_stop_str_in_output)
        with self._requests.track(request_id, result), self._watch_for_death():
            async for output in result:
                completion = output.outputs[0]
                text, hit = stops.feed(completion.text_diff)
                reason = completion.finish_reason
                finished = output.finished or hit is not None
                if hit is not None:
                    reason = "stop"
                elif finished:
                    text += stops.flush()
                yield EngineOutput(
                    text=text,
                    token_ids=list(completion.token_ids_diff),
                    logprobs=self._logprobs(completion) if sampling.logprobs is not None else None,
                    cumulative_logprob=completion.cumulative_logprob,
                    finished=finished,
                    finish_reason=FINISH_REASONS.get(reason, reason) if reason else None,
                )
                if finished:
                    return

    def failure(self) -> str | None:
        return self._fatal

    @contextlib.contextmanager
    def _watch_for_death(self) -> Iterator[None]:
        """The LLM API re-raises its executor's background failure into every caller
        (a RuntimeError); a rejected request raises ValueError/TypeError instead."""
        try:
            yield
        except (ValueError, TypeError):
            raise
        except Exception as exc:
            self._fatal = f"the TensorRT-LLM executor failed: {exc!r}"
            raise

    async def abort(self, request_id: str) -> None:
        result = self._requests.get(request_id)
        if result is not None:
            _abort_unfinished(result)

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self._requests))
