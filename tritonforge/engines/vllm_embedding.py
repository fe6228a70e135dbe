"""vLLM's pooling runner as an :class:`~tritonforge.engines.embedding.Embedder`.

The engine is vLLM's offline ``LLM`` built from ``model.json`` with the pooling settings
of :mod:`tritonforge.engines.pooling` (last-token pooling, L2-normalised: why, there),
after the same host resolution as the generate engine (``host_settings.py``: dtype from
the CPU's flags, the OpenMP binding), so the two models of one machine compute alike.

Why ``LLM`` and not ``AsyncLLM``: Triton's dynamic batcher hands the model a whole
batch at once, and ``LLM.embed`` takes the whole batch in one call; a non-decoupled
model's ``execute`` blocks its stub until the answers are ready anyway.

Why in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set in this stub's own process):
with its engine core in a process of its own, ``LLM.embed`` sends the prompts one by one
and the core starts a step as soon as the first arrives (seen here: the first row of a
fresh server's first batch embedded alone, the others together), so the batch would be
split by timing. In-process, every prompt is scheduled before the first step: the batch
is embedded in as few forward passes as the token budget (``max_num_batched_tokens``)
allows, the same passes every time, and one process fewer holds the model's memory.

An embedding model needs KV only while a batch is embedded, so its ``model.json`` asks
for a small cache; the host settings clear ``VLLM_CPU_KVCACHE_SPACE`` so that size wins
(host_settings.py; measured: the stub held 2.2 GiB with the variable's 1 GiB).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from vllm import LLM
from vllm.config import PoolerConfig
from vllm.inputs import TokensPrompt
from vllm.logger import init_logger
from vllm.platforms import current_platform

from tritonforge.engines.base import StoredTokenLimits
from tritonforge.engines.embedding import Embedded, Embedder
from tritonforge.engines.host_settings import for_this_host
from tritonforge.engines.pooling import pooling_settings
from tritonforge.engines.vllm import VllmEngine

_log = init_logger("vllm.tritonforge")
#: "0": vLLM runs the engine core in the calling process (module docstring: why).
IN_PROCESS_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
#: vLLM's legacy CPU KV-cache size in GiB, unset here (module docstring: why).


class VllmEmbedder(StoredTokenLimits, Embedder):
    """SmolLM2 (or any decoder vLLM can convert) embedding prompts on the pooling runner."""

    config_file = VllmEngine.config_file

    def __init__(self, engine: dict[str, Any], reasons: tuple[str, ...]) -> None:
        self._engine_args = engine
        self._reasons = reasons
        self._llm: LLM | None = None
        self._tokenizer: Any = None

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> VllmEmbedder:
        """Pooling settings checked, host settings resolved; the binding and the in-process
        engine (module docstring) set in this process, which is this model's stub alone."""
        resolved = for_this_host(pooling_settings(settings), current_platform.is_cpu())
        resolved.apply(os.environ)
        os.environ[IN_PROCESS_ENV] = "0"
        return cls(resolved.engine, resolved.reasons)

    def start(self) -> None:
        args = dict(self._engine_args)
        pooler = PoolerConfig(**args.pop("pooler_config"))
        self._llm = LLM(**args, pooler_config=pooler)
        for line in self._reasons:  # vLLM configures its loggers while building the engine
            _log.info(line)
        self._tokenizer = self._llm.get_tokenizer()
        config = self._llm.llm_engine.model_config
        self._max_context = config.max_model_len
        self._vocab_size = config.get_vocab_size()

    def shutdown(self) -> None:
        llm, self._llm = self._llm, None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()

    def tokenize(self, text: str) -> list[int]:
        # As vLLM tokenizes a text prompt for embedding (special tokens added).
        return list(self._tokenizer.encode(text, add_special_tokens=True))

    def embed(self, prompts: Sequence[Sequence[int]]) -> list[Embedded]:
        assert self._llm is not None, "engine not started"
        outputs = self._llm.embed(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], use_tqdm=False
        )
        embedded = []
        for output in outputs:
            if output.error is not None:
                raise RuntimeError(f"the vLLM engine failed a prompt: {output.error}")
            vector = np.asarray(output.outputs.embedding, dtype=np.float32)
            embedded.append(Embedded(vector, len(output.prompt_token_ids or ())))
        return embedded
