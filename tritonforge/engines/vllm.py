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

On CPU, vLLM 0.32 gets that mix wrong: its torch LoRA kernels (``bgmv_shrink`` /
``bgmv_expand``) index the stacked adapter weights with each token's slot, and a
base-model token's slot is -1, which torch reads as the *last* slot. A base request
batched with adapter requests then answers with whichever adapter sits there (seen:
three requests base/alpha/beta in one batch, the base one gave beta's text). So on CPU
base requests run with a zero adapter (``lora_B`` all zero: the base model's output
exactly) made at start, never -1; ``max_loras`` grows by one so the real adapters keep
their slots. Workaround L1, see docs/triton-2.51-workarounds.md.

Adapters loaded at run time go to the running engine with ``AsyncLLM.add_lora`` (which
loads and checks the weights at once) and are dropped with ``remove_lora``; requests
hold their ``LoRARequest``, so one already running with an unloaded adapter finishes
with it (vLLM loads an adapter a running request names again if it left the cache).
A model that starts without adapters reserves the zero adapter's slot anyway, and makes
the zero adapter from the first adapter loaded.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from safetensors.numpy import load_file, save_file
from vllm import SamplingParams as VllmSamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.exceptions import VLLMClientError
from vllm.inputs import TokensPrompt
from vllm.logger import init_logger
from vllm.lora.request import LoRARequest
from vllm.platforms import current_platform
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.stats import IterationStats, MultiModalCacheStats, SchedulerStats

from tritonforge.engines.base import (
    ConfigFile,
    EngineOutput,
    EngineStats,
    HFTokenizedEngine,
    PositionLogprobs,
    PreparedPrompt,
    TokenLogprob,
    adapter_unloaded,
    stop_on_thread,
)
from tritonforge.engines.compact_json import compact_json_grammar
from tritonforge.engines.host_settings import for_this_host
from tritonforge.engines.lora import LORA_FILE, LoraAdapter
from tritonforge.serving.errors import RequestError
from tritonforge.serving.sampling import MAX_N, SamplingParams
from tritonforge.serving.tracing import engine_trace_headers

# Under vLLM's logger tree, so the lines reach the server log through vLLM's own handler
# (which vLLM sets up while it builds the engine: the lines are logged after that).
_log = init_logger("vllm.tritonforge")


class _SchedulerSnapshot(StatLoggerBase):
    """Keeps the latest scheduler stats where the adapter can read them."""

    latest: EngineStats = EngineStats()

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        del vllm_config, engine_index

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        mm_cache_stats: MultiModalCacheStats | None = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is not None:
            type(self).latest = EngineStats(
                running=scheduler_stats.num_running_reqs,
                waiting=scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs,
                kv_cache_usage=scheduler_stats.kv_cache_usage,
            )

    def log_engine_initialized(self) -> None:
        pass


def to_vllm_sampling(params: SamplingParams) -> VllmSamplingParams:
    """Map the common vocabulary onto vLLM's SamplingParams (deltas; ``n`` sequences,
    which vLLM samples from one prefill of the prompt)."""
    structured = None
    if params.structured_outputs is not None:
        spec = params.structured_outputs
        if spec.disable_any_whitespace:  # per request: vLLM reads only its engine-wide switch
            structured = StructuredOutputsParams(
                grammar=compact_json_grammar(spec.kind, spec.value)
            )
        else:
            structured = StructuredOutputsParams(**{spec.kind: spec.value})
    return VllmSamplingParams(
        n=params.n,
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


#: The zero adapter's id (workaround L1): above any id an adapter of the model gets.
BASE_LORA_ID = 2**31 - 1


def _position_logprobs(candidates: dict[int, Any]) -> PositionLogprobs:
    return {
        token: TokenLogprob(logprob=c.logprob, rank=c.rank, decoded_token=c.decoded_token)
        for token, c in candidates.items()
    }


def _zero_adapter(like: Path, target: Path) -> Path:
    """A copy of the PEFT adapter at ``like`` whose ``lora_B`` weights are all zero.

    Its delta ``x @ A @ B`` is exactly zero, so a request run with it answers exactly as
    the base model; it exists only to give base requests a real adapter slot on CPU.
    """
    target.mkdir(parents=True)
    config = json.loads((like / "adapter_config.json").read_text(encoding="utf-8"))
    (target / "adapter_config.json").write_text(json.dumps(config), encoding="utf-8")
    weights = load_file(like / "adapter_model.safetensors")
    save_file(
        {k: v * 0 if "lora_B" in k else v for k, v in weights.items()},
        target / "adapter_model.safetensors",
    )
    return target


class VllmEngine(HFTokenizedEngine):
    metric_prefix = "vllm"
    config_file = ConfigFile("model.json", path_keys=("model", "tokenizer"))
    max_n = MAX_N  # one request, n sequences: vLLM shares the prompt's prefill
    refusals = (ValueError, VLLMClientError)  # VLLMValidationError is not a ValueError

    def __init__(self, engine_args: AsyncEngineArgs) -> None:
        self._args = engine_args
        self._engine: AsyncLLM | None = None
        self._lora_requests: dict[str, LoRARequest] = {}
        #: What base-model requests run with while adapters are served (None: no adapter).
        self._base_lora: LoRARequest | None = None
        self._base_slot_reserved = False
        self._scratch: Path | None = None
        #: Why each host-dependent setting is what it is (logged once vLLM's logging is set up).
        self._settings_log: tuple[str, ...] = ()
        #: vLLM exports request spans of its own (``otlp_traces_endpoint`` in model.json):
        #: a traced request's context goes with it, so they join its trace.
        self._traces = False
        if engine_args.scheduling_policy == "priority":
            self.priority_unsupported = None
        else:
            self.priority_unsupported = (
                f"vLLM schedules this model {engine_args.scheduling_policy!r}, not by priority "
                '(set "scheduling_policy": "priority" in model.json)'
            )

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> VllmEngine:
        """Resolve the host-dependent settings (host_settings.py), log them, build the args.

        The OpenMP binding (and the KV-cache size variable that must not override
        ``kv_cache_memory_bytes``) are environment variables vLLM reads when it starts its
        worker (at ``start``), so they are set here, in this model's own stub process.
        """
        resolved = for_this_host(settings, current_platform.is_cpu())
        resolved.apply(os.environ)
        # Never log prompts: vLLM's request logging stays off whatever the file says.
        engine = cls(AsyncEngineArgs(**{**resolved.engine, "enable_log_requests": False}))
        engine._settings_log = resolved.reasons
        return engine

    def serve_adapters(self, adapters: tuple[LoraAdapter, ...]) -> None:
        """Check the adapters against the engine's LoRA settings now, not at a request."""
        if not self._args.enable_lora:
            raise ValueError(
                f'{LORA_FILE} lists adapters but model.json does not set "enable_lora": true'
            )
        limit = self._args.max_lora_rank
        for adapter in adapters:
            if adapter.rank > limit:
                raise ValueError(
                    f"{LORA_FILE}: adapter {adapter.name!r} has rank {adapter.rank}, above "
                    f"max_lora_rank {limit} in model.json"
                )
        self.adapters = {adapter.name: adapter for adapter in adapters}
        self._lora_requests = {a.name: LoRARequest(a.name, a.int_id, str(a.path)) for a in adapters}
        self._reserve_base_slot()
        self._make_base_lora(adapters[0].path)

    def _reserve_base_slot(self) -> None:
        """One more adapter slot for the zero adapter (workaround L1), once, before start."""
        if self._base_slot_reserved or not self._args.enable_lora or not current_platform.is_cpu():
            return
        self._base_slot_reserved = True
        self._args.max_loras += 1
        if self._args.max_cpu_loras is not None:
            self._args.max_cpu_loras += 1

    def _make_base_lora(self, like: Path) -> None:
        """The zero adapter base requests run with on CPU (workaround L1), made once."""
        if self._base_lora is not None or not self._base_slot_reserved:
            return
        self._scratch = Path(tempfile.mkdtemp(prefix="tritonforge-base-lora-"))
        zero = _zero_adapter(like, self._scratch / "base")
        self._base_lora = LoRARequest("tritonforge-base", BASE_LORA_ID, str(zero))

    @property
    def loads_adapters(self) -> bool:
        return bool(self._args.enable_lora)

    async def load_adapter(self, adapter: LoraAdapter) -> None:
        """``add_lora`` on the running engine: it reads and checks the weights now."""
        if not self._args.enable_lora:
            raise RequestError(
                "lora_control",
                'this model cannot load LoRA adapters: model.json does not set "enable_lora": true',
            )
        limit = self._args.max_lora_rank
        if adapter.rank > limit:
            raise RequestError(
                "lora_path",
                f"adapter {adapter.name!r} has rank {adapter.rank}, above max_lora_rank "
                f"{limit} in model.json",
            )
        assert self._engine is not None, "engine not started"
        request = LoRARequest(adapter.name, adapter.int_id, str(adapter.path))
        try:
            await self._engine.add_lora(request)
            # Before the adapter is served: base requests must never meet it without one.
            self._make_base_lora(adapter.path)
        except Exception as exc:
            raise RequestError(
                "lora_path", f"vLLM could not load the adapter at {adapter.path}: {exc}"
            ) from None
        self._lora_requests = {**self._lora_requests, adapter.name: request}
        self.adapters = {**self.adapters, adapter.name: adapter}

    async def unload_adapter(self, name: str) -> None:
        request = self._lora_requests[name]
        self.adapters = {k: v for k, v in self.adapters.items() if k != name}
        self._lora_requests = {k: v for k, v in self._lora_requests.items() if k != name}
        if self._engine is not None:
            await self._engine.remove_lora(request.lora_int_id)

    async def start(self) -> None:
        self._reserve_base_slot()
        self._engine = AsyncLLM.from_engine_args(self._args, stat_loggers=[_SchedulerSnapshot])
        self._traces = self._engine.observability_config.otlp_traces_endpoint is not None
        for line in self._settings_log:  # vLLM configures its loggers while building the engine
            _log.info(line)
        self._tokenizer = self._engine.get_tokenizer()
        self._max_context = self._engine.model_config.max_model_len
        self.max_running = self._engine.vllm_config.scheduler_config.max_num_seqs
        self._vocab_size = self._engine.model_config.get_vocab_size()

    async def shutdown(self) -> None:
        engine, self._engine = self._engine, None
        await stop_on_thread(engine, lambda engine: engine.shutdown())
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)

    async def generate(
        self, request_id: str, prompt: PreparedPrompt, sampling: SamplingParams
    ) -> AsyncIterator[EngineOutput]:
        assert self._engine is not None, "engine not started"
        engine_prompt = TokensPrompt(prompt_token_ids=list(prompt.token_ids))
        if prompt.text is not None:
            engine_prompt["prompt"] = prompt.text
        lora = self._base_lora
        if sampling.lora_name is not None:
            lora = self._lora_requests.get(sampling.lora_name)
            if lora is None:
                raise adapter_unloaded(sampling.lora_name)
        async for result in self._engine.generate(
            engine_prompt,
            to_vllm_sampling(sampling),
            request_id,
            lora_request=lora,
            priority=sampling.priority,
            trace_headers=engine_trace_headers() if self._traces else None,
        ):
            # One completion per step with n = 1; with n > 1 each step's output holds
            # the sequences it advanced, each with its index.
            for completion in result.outputs:
                yield EngineOutput(
                    text=completion.text,
                    token_ids=list(completion.token_ids),
                    logprobs=None
                    if completion.logprobs is None
                    else [_position_logprobs(position) for position in completion.logprobs],
                    cumulative_logprob=completion.cumulative_logprob,
                    finished=result.finished or completion.finish_reason is not None,
                    finish_reason=completion.finish_reason,
                    index=completion.index,
                )

    def check_sampling(self, sampling: SamplingParams) -> None:
        """vLLM's own checks (``SamplingParams`` validates itself when built), now.

        Beyond the shared ranges vLLM refuses combinations (``n`` > 1 with greedy
        sampling) and settings past its own limits; built here, its refusal is an
        invalid argument naming the key, not a failure inside ``generate``.
        """
        to_vllm_sampling(sampling)

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
        # The zero adapter of workaround L1 holds a slot of its own: not one for requests.
        reserved = 1 if self._base_slot_reserved else 0
        max_lora = self._args.max_loras - reserved if self._args.enable_lora else 0
        return dataclasses.replace(_SchedulerSnapshot.latest, max_lora=max_lora)
