"""vLLM adapter: the only module that imports vLLM.

The engine is vLLM V1's ``AsyncLLM`` built from ``model.json`` (``AsyncEngineArgs``
keys, exactly as upstream vllm_backend reads them). Outputs are requested as deltas
(``RequestOutputKind.DELTA``) so every engine step becomes one streamed response, and
vLLM's own detokenizer keeps multi-byte characters whole across steps. Scheduler
state (running/waiting requests, KV-cache usage) arrives through a stat logger.

LoRA follows upstream vllm_backend: ``enable_lora`` / ``max_loras`` / ``max_lora_rank``
in ``model.json`` go to the engine as they are, the adapters come from
``multi_lora.json``, and a request naming one runs with that adapter's
``LoRARequest`` (built once per adapter, so its id never changes). vLLM batches
requests of different adapters and of the base model together.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from vllm import SamplingParams as VllmSamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import TokensPrompt
from vllm.lora.request import LoRARequest
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.metrics.loggers import StatLoggerBase

from tritonforge.engines.base import (
    ConfigFile,
    EngineOutput,
    EngineStats,
    HFTokenizedEngine,
    PositionLogprobs,
    PreparedPrompt,
    TokenLogprob,
    stop_on_thread,
)
from tritonforge.lora import LORA_FILE, LoraAdapter
from tritonforge.sampling import SamplingParams


class _SchedulerSnapshot(StatLoggerBase):
    """Keeps the latest scheduler stats where the adapter can read them."""

    latest: EngineStats = EngineStats()

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        del vllm_config, engine_index

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
        if scheduler_stats is not None:
            type(self).latest = EngineStats(
                running=scheduler_stats.num_running_reqs,
                waiting=scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs,
                kv_cache_usage=scheduler_stats.kv_cache_usage,
            )

    def log_engine_initialized(self) -> None:
        pass


def to_vllm_sampling(params: SamplingParams) -> VllmSamplingParams:
    """Map the common vocabulary onto vLLM's SamplingParams (deltas, one sequence)."""
    structured = None
    if params.structured_outputs is not None:
        spec = params.structured_outputs
        structured = StructuredOutputsParams(
            **{spec.kind: spec.value}, disable_any_whitespace=spec.disable_any_whitespace
        )
    return VllmSamplingParams(
        n=1,
        max_tokens=params.max_tokens,
        min_tokens=params.min_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        min_p=params.min_p,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty,
        seed=params.seed,
        stop=list(params.stop) or None,
        stop_token_ids=list(params.stop_token_ids) or None,
        ignore_eos=params.ignore_eos,
        logprobs=params.logprobs,
        skip_special_tokens=params.skip_special_tokens,
        include_stop_str_in_output=params.include_stop_str_in_output,
        structured_outputs=structured,
        output_kind=RequestOutputKind.DELTA,
    )


def _position_logprobs(candidates: dict[int, Any]) -> PositionLogprobs:
    return {
        token: TokenLogprob(logprob=c.logprob, rank=c.rank, decoded_token=c.decoded_token)
        for token, c in candidates.items()
    }


class VllmEngine(HFTokenizedEngine):
    metric_prefix = "vllm"
    config_file = ConfigFile("model.json", path_keys=("model", "tokenizer"))

    def __init__(self, engine_args: AsyncEngineArgs) -> None:
        self._args = engine_args
        self._engine: AsyncLLM | None = None
        self._lora_requests: dict[str, LoRARequest] = {}

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> VllmEngine:
        # Never log prompts: vLLM's request logging stays off whatever the file says.
        settings["enable_log_requests"] = False
        return cls(AsyncEngineArgs(**settings))

    def serve_adapters(self, adapters: tuple[LoraAdapter, ...]) -> None:
        """Check the adapters against the engine's LoRA settings now, not at a request."""
        if not self._args.enable_lora:
            raise ValueError(
                f'{LORA_FILE} lists adapters but model.json does not set "enable_lora": true'
            )
        limit = self._args.max_lora_rank
        for adapter in adapters:
            if limit is not None and adapter.rank > limit:
                raise ValueError(
                    f"{LORA_FILE}: adapter {adapter.name!r} has rank {adapter.rank}, above "
                    f"max_lora_rank {limit} in model.json"
                )
        self.adapters = {adapter.name: adapter for adapter in adapters}
        self._lora_requests = {a.name: LoRARequest(a.name, a.int_id, str(a.path)) for a in adapters}

    async def start(self) -> None:
        self._engine = AsyncLLM.from_engine_args(self._args, stat_loggers=[_SchedulerSnapshot])
        self._tokenizer = self._engine.get_tokenizer()
        self._max_context = self._engine.model_config.max_model_len
        self._vocab_size = self._engine.model_config.get_vocab_size()

    async def shutdown(self) -> None:
        engine, self._engine = self._engine, None
        await stop_on_thread(engine, lambda engine: engine.shutdown())

    async def generate(
        self, request_id: str, prompt: PreparedPrompt, sampling: SamplingParams
    ) -> AsyncIterator[EngineOutput]:
        assert self._engine is not None, "engine not started"
        engine_prompt = TokensPrompt(prompt_token_ids=list(prompt.token_ids))
        if prompt.text is not None:
            engine_prompt["prompt"] = prompt.text
        lora = None if sampling.lora_name is None else self._lora_requests[sampling.lora_name]
        async for result in self._engine.generate(
            engine_prompt, to_vllm_sampling(sampling), request_id, lora_request=lora
        ):
            completion = result.outputs[0]
            yield EngineOutput(
                text=completion.text,
                token_ids=list(completion.token_ids),
                logprobs=None
                if completion.logprobs is None
                else [_position_logprobs(position) for position in completion.logprobs],
                cumulative_logprob=completion.cumulative_logprob,
                finished=result.finished,
                finish_reason=completion.finish_reason,
            )

    async def abort(self, request_id: str) -> None:
        if self._engine is not None:
            await self._engine.abort(request_id)

    def failure(self) -> str | None:
        # vLLM's own monitor marks the engine dead as soon as an engine-core process
        # exits, and its output handler stops on any engine error.
        engine = self._engine
        if engine is not None and engine.errored:
            return "the vLLM engine core stopped (process exited or engine error)"
        return None

    def stats(self) -> EngineStats:
        return _SchedulerSnapshot.latest
