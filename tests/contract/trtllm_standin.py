"""A stand-in for TensorRT-LLM's LLM API, written from its documentation and source.

This is NOT TensorRT-LLM. It follows the documented surface the adapter uses, so the
contract test can check the adapter's side of the contract on a machine without a GPU:

* ``LLM(**kwargs)`` with ``.tokenizer`` (``encode``, ``decode``, ``apply_chat_template``,
  ``eos_token_id``, ``.tokenizer`` the wrapped HF tokenizer), ``.args.max_seq_len``,
  ``generate_async(inputs, sampling_params=None, ..., streaming=False)`` and ``shutdown()``;
  ``inputs`` is a prompt string, a token-id list or a ``{"prompt"}`` /
  ``{"prompt_token_ids"}`` dict.
* ``generate_async`` returns a ``RequestOutput`` (a ``GenerationResult``): async-iterable,
  each step yielding the same object with ``finished`` and ``outputs`` — one
  ``CompletionOutput`` per sequence, mutated in place: cumulative ``text`` /
  ``token_ids`` / ``logprobs`` (``dict[token_id, Logprob(logprob, rank)]`` per token,
  PyTorch backend) and the ``text_diff`` / ``token_ids_diff`` / ``logprobs_diff`` of the
  last step; ``finish_reason`` in ``stop | length | timeout | cancelled``;
  ``stop_reason`` the stop string or token id; ``abort()`` ends the request, which
  then finishes with ``cancelled``.
* ``generate_async(..., priority=p)``: the request's scheduling priority, a float in
  [0, 1], higher first, default 0.5 (``DEFAULT_REQUEST_PRIORITY``).
* LoRA (PyTorch backend): ``LLM(lora_config=LoraConfig(lora_dir=[…], max_lora_rank,
  max_loras, max_cpu_loras))`` and ``generate_async(..., lora_request=LoRARequest(name,
  int_id, path))``; a request whose adapter the LLM was not configured with fails.
* ``SamplingParams`` and ``GuidedDecodingParams`` are keyword-only dataclasses with the
  documented fields and defaults, so an argument the real class lacks fails here too.
  Greedy decoding when neither ``top_k`` nor ``top_p`` is set (``_greedy_decoding``);
  ``best_of`` must not be below ``n``; ``stop`` strings are cut from the text unless
  ``include_stop_str_in_output``.

The "model" is a script: it answers every prompt with :data:`SCRIPT`, one character per
token (token id = code point; the end token is 0), which makes every mapping visible.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

SCRIPT = "Hello, wörld! Ünïcödé 🙂 ends here."
END_ID = 0
#: ``tensorrt_llm.executor.request.DEFAULT_REQUEST_PRIORITY``: a request's priority is a
#: float in [0, 1], higher scheduled first (the executor ``Request``'s default).
DEFAULT_REQUEST_PRIORITY = 0.5
STEP_S = 0.002  # an engine step takes time, so a client can cancel mid-stream


@dataclass(slots=True, kw_only=True)
class GuidedDecodingParams:
    json: str | dict | None = None
    regex: str | None = None
    grammar: str | None = None
    json_object: bool = False
    structural_tag: str | None = None

    def _validate(self) -> None:
        guides = sum(bool(getattr(self, f)) for f in self.__slots__)
        if guides > 1:
            raise ValueError(f"Only one guide can be used for a request, but got {guides}.")


@dataclass(slots=True, kw_only=True)
class SamplingParams:
    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    bad: str | list[str] | None = None
    bad_token_ids: list[int] | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    embedding_bias: Any = None
    logits_processor: Any = None
    apply_batched_logits_processor: bool = False
    n: int = 1
    best_of: int | None = None
    use_beam_search: bool = False
    top_k: int | None = None
    top_p: float | None = None
    top_p_min: float | None = None
    top_p_reset_ids: int | None = None
    top_p_decay: float | None = None
    seed: int | None = None
    temperature: float | None = None
    min_tokens: int | None = None
    beam_search_diversity_rate: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    length_penalty: float | None = None
    early_stopping: int | None = None
    no_repeat_ngram_size: int | None = None
    min_p: float | None = None
    beam_width_array: list[int] | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    return_context_logits: bool = False
    return_generation_logits: bool = False
    exclude_input_from_output: bool = True
    return_encoder_output: bool = False
    return_perf_metrics: bool = False
    additional_model_outputs: list | None = None
    lookahead_config: Any = None
    guided_decoding: GuidedDecodingParams | None = None
    ignore_eos: bool = False
    detokenize: bool = True
    add_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True

    def __post_init__(self) -> None:
        if self.pad_id is None:
            self.pad_id = self.end_id
        self.best_of = self.best_of or self.n
        if self.best_of < self.n:
            raise ValueError(f"best_of ({self.best_of}) cannot be less than n ({self.n})")
        if self.guided_decoding is not None:
            self.guided_decoding._validate()
        self.logprobs = self.logprobs and int(self.logprobs)

    @property
    def _greedy_decoding(self) -> bool:
        return (
            not self.use_beam_search
            and (self.top_k is None or self.top_k == 1)
            and (self.top_p is None or self.top_p == 0.0)
        )


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int | None = None


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    prompt_logprobs: list = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    generation_logits: Any = None
    disaggregated_params: Any = None
    _last_text_len: int = field(default=0, init=False, repr=False)
    _last_token_ids_len: int = field(default=0, init=False, repr=False)
    _last_logprobs_len: int = field(default=0, init=False, repr=False)

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def text_diff(self) -> str:
        return self.text[self._last_text_len :]

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_token_ids_len :]

    @property
    def logprobs_diff(self) -> list[dict[int, Logprob]]:
        return self.logprobs[self._last_logprobs_len :]


class Tokenizer:
    """Character-level: token id = code point; mirrors TransformersTokenizer's surface."""

    eos_token_id = END_ID
    pad_token_id = END_ID

    def __init__(self) -> None:
        self.tokenizer = range(0x20000)  # the wrapped HF tokenizer: len() is its vocab

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(t) for t in token_ids if t != END_ID or not skip_special_tokens)

    def apply_chat_template(self, conversation, tokenize=False, add_generation_prompt=False):
        text = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in conversation)
        return text + ("<assistant>" if add_generation_prompt else "")


class RequestOutput:
    """A GenerationResult: iterate it (async) for steps; ``abort()`` cancels."""

    def __init__(self, llm: LLM, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self._llm = llm
        self.request_id = next(llm._ids)
        self.prompt_token_ids = prompt_token_ids
        self.sampling_params = params
        self._outputs = [CompletionOutput(0)]
        self._done = False
        self._aborted = False
        self._rng = random.Random(params.seed or 0)

    @property
    def outputs(self) -> list[CompletionOutput]:
        return self._outputs[: self.sampling_params.n]

    @property
    def finished(self) -> bool:
        return self._done

    def abort(self) -> None:
        self._aborted = True
        self._llm.aborted.append(self.request_id)

    def aborted(self) -> bool:
        return self._aborted

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        await asyncio.sleep(STEP_S)  # one engine step
        self._step()
        return self

    def _step(self) -> None:
        out, params = self._outputs[0], self.sampling_params
        out._last_text_len = len(out.text)
        out._last_token_ids_len = len(out.token_ids)
        out._last_logprobs_len = len(out.logprobs)
        if self._aborted:
            out.finish_reason, self._done = "cancelled", True
            return
        position = len(out.token_ids)
        token = ord(SCRIPT[position]) if position < len(SCRIPT) else END_ID
        if token == END_ID and params.ignore_eos:
            token = ord(" ")
        out.token_ids.append(token)
        if params.logprobs:
            top = {token: Logprob(-0.25, 1)}
            top.update({t: Logprob(-3.0 - i, i + 2) for i, t in enumerate((65, 66))})
            out.logprobs.append(dict(list(top.items())[: max(params.logprobs, 1)]))
            out.cumulative_logprob = (out.cumulative_logprob or 0.0) - 0.25
        if token == END_ID:
            out.finish_reason, self._done = "stop", True
            return
        out.text = self._llm.tokenizer.decode(out.token_ids)
        stops = [params.stop] if isinstance(params.stop, str) else (params.stop or [])
        for stop in stops:
            if out.text.endswith(stop):
                out.finish_reason, out.stop_reason, self._done = "stop", stop, True
                if not params.include_stop_str_in_output:
                    out.text = out.text[: -len(stop)]
                return
        if token in (params.stop_token_ids or []):
            out.finish_reason, out.stop_reason, self._done = "stop", token, True
        elif len(out.token_ids) >= params.max_tokens:
            out.finish_reason, self._done = "length", True


@dataclass(slots=True)
class LoRARequest:
    """``tensorrt_llm.executor.request.LoRARequest(lora_name, lora_int_id, lora_path)``."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    lora_ckpt_source: str = "hf"

    def __post_init__(self) -> None:
        if self.lora_ckpt_source not in ("hf", "nemo"):
            raise ValueError(
                f"lora_ckpt_source must be 'hf' or 'nemo', got {self.lora_ckpt_source}"
            )


@dataclass(slots=True, kw_only=True)
class LoraConfig:
    """``tensorrt_llm.lora_manager.LoraConfig``: the documented fields and defaults."""

    lora_dir: list[str] = field(default_factory=list)
    lora_ckpt_source: str = "hf"
    max_lora_rank: int = 64
    lora_target_modules: list[str] = field(default_factory=list)
    trtllm_modules_to_hf_modules: dict[str, str] = field(default_factory=dict)
    max_loras: int | None = None
    max_cpu_loras: int | None = None


@dataclass
class _Args:
    max_seq_len: int | None


class LLM:
    """Records what the adapter asked of it; ``instances`` keeps every one built."""

    instances: list[LLM] = []  # noqa: RUF012 - deliberately shared: the test inspects it

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.kwargs = {"model": model, **kwargs}
        self.args = _Args(kwargs.get("max_seq_len"))
        self.tokenizer = Tokenizer()
        self.requests: list[tuple[Any, SamplingParams, bool]] = []
        self.lora_requests: list[LoRARequest | None] = []  # per request, in order
        self.priorities: list[float] = []  # per request, in order
        self.aborted: list[int] = []
        self.is_shut_down = False
        self._ids = iter(range(1, 1 << 30))
        LLM.instances.append(self)

    def generate_async(
        self,
        inputs: Any,
        sampling_params: SamplingParams | None = None,
        lora_request: Any = None,
        prompt_adapter_request: Any = None,
        streaming: bool = False,
        priority: float = DEFAULT_REQUEST_PRIORITY,
        **kwargs: Any,
    ) -> RequestOutput:
        asyncio.get_running_loop()  # results bind to the caller's event loop
        if not 0.0 <= priority <= 1.0:
            raise ValueError(f"priority must be in [0, 1], got {priority}")
        self.priorities.append(priority)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if not isinstance(sampling_params, SamplingParams):
            raise TypeError(f"The sampling_params must be SamplingParams, got {sampling_params}")
        if isinstance(inputs, str):
            inputs = {"prompt": inputs}
        elif isinstance(inputs, list):
            inputs = {"prompt_token_ids": inputs}
        if "prompt_token_ids" in inputs:
            ids = list(inputs["prompt_token_ids"])
        elif "prompt" in inputs:
            ids = self.tokenizer.encode(inputs["prompt"])
        else:
            raise TypeError(f"The inputs must be type str or list of int, but got {inputs}")
        if lora_request is not None:
            config = self.kwargs.get("lora_config")
            if not isinstance(config, LoraConfig):
                raise ValueError("LoRA request given but the LLM was built without lora_config")
            if lora_request.lora_path not in config.lora_dir:
                raise ValueError(f"LoRA adapter {lora_request.lora_path} is not in lora_dir")
        if sampling_params.end_id is None:
            sampling_params.end_id = self.tokenizer.eos_token_id
        self.requests.append((inputs, sampling_params, streaming))
        self.lora_requests.append(lora_request)
        return RequestOutput(self, ids, sampling_params)

    def shutdown(self) -> None:
        self.is_shut_down = True
