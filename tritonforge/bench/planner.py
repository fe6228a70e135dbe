"""Capacity planner: KV-cache arithmetic and the scheduler's per-iteration token split.

Before measuring, a contract can be checked on paper: how many bytes one token's KV
entries take, how many of the contract's sequences fit in the cache at once, and how
vLLM's scheduler splits one iteration's token budget between running decodes (one
token each) and chunked prefills. The split follows vLLM V1's rule for a prefill:

    scheduled = min(remaining, long_prefill_threshold, budget left)

with ``remaining`` = prompt tokens not yet computed, prefix-cache hits excluded. If the
contract's concurrency needs more KV blocks than exist, the engine preempts, and the
measured TTFT/TPOT will show it: the planner says so before anything runs.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from tritonforge.bench.contract import Contract
from tritonforge.bench.workload import draw_length

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "fp8": 1}
CPU_DEFAULT_BLOCK_SIZE = 128  # vLLM's CPU platform default (GPU default is 16)
DEFAULT_TOKEN_BUDGET = 2048


@dataclass(frozen=True)
class KvGeometry:
    """What sizes one token's keys and values across all layers."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes  # K and V

    @classmethod
    def from_config(cls, config: dict[str, Any], dtype: str | None = None) -> KvGeometry:
        """From a HuggingFace config.json; grouped-query attention uses the KV head count."""
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
        # "auto" (model.json's default) means the model's own dtype, as vLLM reads it.
        chosen = None if dtype == "auto" else dtype
        name = (chosen or config.get("dtype") or config.get("torch_dtype") or "bfloat16").lower()
        if name not in DTYPE_BYTES:
            raise ValueError(f"unknown KV dtype {name!r}; known: {', '.join(DTYPE_BYTES)}")
        return cls(int(config["num_hidden_layers"]), kv_heads, head_dim, DTYPE_BYTES[name])


def blocks_for(tokens: int, block_size: int) -> int:
    return math.ceil(tokens / block_size)


def cache_blocks(kv_cache_bytes: int, geometry: KvGeometry, block_size: int) -> int:
    return kv_cache_bytes // (geometry.bytes_per_token * block_size)


def sequences_that_fit(
    kv_cache_bytes: int, geometry: KvGeometry, sequence_tokens: int, block_size: int
) -> int:
    """Whole sequences of ``sequence_tokens`` (prompt + output) the cache holds at once."""
    return cache_blocks(kv_cache_bytes, geometry, block_size) // blocks_for(
        sequence_tokens, block_size
    )


def remaining_prefill(prompt_tokens: int, cached_tokens: int = 0, computed_tokens: int = 0) -> int:
    """Prompt tokens still to compute. A full cache hit still recomputes the last token:
    the engine needs its logits to sample the first output token."""
    cached = min(cached_tokens, prompt_tokens - 1)
    return max(prompt_tokens - max(cached, computed_tokens), 0)


@dataclass
class IterationPlan:
    """One scheduler step: decode tokens first, then prefill chunks, then what is left."""

    token_budget: int
    decode_tokens: int
    prefill_chunks: list[int] = field(default_factory=list)

    @property
    def prefill_tokens(self) -> int:
        return sum(self.prefill_chunks)

    @property
    def leftover(self) -> int:
        return self.token_budget - self.decode_tokens - self.prefill_tokens


def plan_iteration(
    token_budget: int, long_prefill_threshold: int, decodes: int, prefills: Sequence[int]
) -> IterationPlan:
    """Split one iteration's budget. Running decodes go first (one token each), then each
    waiting prefill gets ``min(remaining, threshold, budget left)``; threshold 0 = no cap."""
    decode_tokens = min(decodes, token_budget)
    plan = IterationPlan(token_budget, decode_tokens)
    budget = token_budget - decode_tokens
    for remaining in prefills:
        if budget <= 0:
            break
        cap = long_prefill_threshold if long_prefill_threshold > 0 else budget
        scheduled = min(remaining, cap, budget)
        if scheduled > 0:
            plan.prefill_chunks.append(scheduled)
            budget -= scheduled
    return plan


@dataclass
class _Seq:
    remaining: int
    outputs_left: int


def simulate_burst(
    prompts: Sequence[int],
    outputs: Sequence[int],
    cached: Sequence[int],
    token_budget: int,
    long_prefill_threshold: int,
    max_num_seqs: int,
    iterations: int,
) -> list[IterationPlan]:
    """The first iterations after ``len(prompts)`` requests arrive together (a burst at the
    contract's top concurrency): how long decodes wait behind prefills."""
    waiting = [
        _Seq(remaining_prefill(p, c), o) for p, o, c in zip(prompts, outputs, cached, strict=True)
    ]
    running: list[_Seq] = []
    plans = []
    for _ in range(iterations):
        decoding = [s for s in running if s.remaining == 0 and s.outputs_left > 0]
        prefilling = [s for s in running if s.remaining > 0]
        while waiting and len(running) < max_num_seqs:
            seq = waiting.pop(0)
            running.append(seq)
            prefilling.append(seq)
        plan = plan_iteration(
            token_budget, long_prefill_threshold, len(decoding), [s.remaining for s in prefilling]
        )
        for seq in decoding[: plan.decode_tokens]:
            seq.outputs_left -= 1
        for seq, chunk in zip(prefilling, plan.prefill_chunks, strict=False):
            seq.remaining -= chunk
            if seq.remaining == 0:
                seq.outputs_left -= 1  # the step that finishes a prefill samples a token
        running = [s for s in running if s.outputs_left > 0]
        plans.append(plan)
        if not running and not waiting:
            break
    return plans


class CapacityPlan(BaseModel):
    model: str
    kv_bytes_per_token: int
    kv_cache_bytes: int
    block_size: int
    cache_blocks: int
    cache_tokens: int
    mean_sequence_tokens: float
    max_sequence_tokens: int
    sequences_fit_mean: int
    sequences_fit_max: int
    max_concurrency: int
    token_budget: int
    long_prefill_threshold: int
    iterations: list[dict[str, Any]]
    warnings: list[str]


def draw_burst(contract: Contract, top: int, block: int) -> tuple[list[int], list[int], list[int]]:
    """``top`` requests drawn from the mix: prompt and output lengths, and cached prompt
    tokens (the shared prefix's whole blocks, a hit for every sharer after the first)."""
    rng = random.Random(contract.seed)
    classes = contract.traffic.classes
    prefix = contract.traffic.shared_prefix
    cached_prefix = (prefix.tokens // block) * block  # only whole blocks are cached
    prompts, outputs, cached = [], [], []
    prefix_warm = False
    for _ in range(top):
        cls = rng.choices(classes, [c.share for c in classes])[0]
        prompts.append(draw_length(cls.input_tokens, rng))
        outputs.append(draw_length(cls.output_tokens, rng))
        shares = prefix.share > 0 and rng.random() < prefix.share
        cached.append(cached_prefix if shares and prefix_warm else 0)
        prefix_warm = prefix_warm or shares
    return prompts, outputs, cached


def capacity_warnings(top: int, fit_mean: int, max_seqs: int) -> list[str]:
    """What the burst at the top concurrency will run into."""
    warnings = []
    if top > fit_mean:
        warnings.append(
            f"top concurrency {top} > {fit_mean} mean-length sequences that fit: expect preemption"
        )
    if top > max_seqs:
        warnings.append(
            f"top concurrency {top} > max_num_seqs {max_seqs}: requests queue in the engine"
        )
    return warnings


def plan_contract(
    contract: Contract,
    model_config: dict[str, Any],
    kv_cache_bytes: int,
    engine: dict[str, Any] | None = None,
    iterations: int = 8,
) -> CapacityPlan:
    """Everything above for one contract and one engine configuration (model.json)."""
    engine = engine or {}
    geometry = KvGeometry.from_config(
        model_config, engine.get("kv_cache_dtype") or engine.get("dtype")
    )
    block = int(engine.get("block_size") or CPU_DEFAULT_BLOCK_SIZE)
    budget = int(engine.get("max_num_batched_tokens") or DEFAULT_TOKEN_BUDGET)
    threshold = int(engine.get("long_prefill_token_threshold") or 0)
    max_seqs = int(engine.get("max_num_seqs") or 256)
    classes = contract.traffic.classes
    mean_seq = sum(c.share * (c.input_tokens.mean() + c.output_tokens.mean()) for c in classes)
    max_seq = max(c.input_tokens.bounds()[1] + c.output_tokens.bounds()[1] for c in classes)
    top = int(max(contract.load.levels)) if contract.load.mode == "concurrency" else max_seqs
    blocks = cache_blocks(kv_cache_bytes, geometry, block)

    plans = simulate_burst(
        *draw_burst(contract, top, block), budget, threshold, max_seqs, iterations
    )
    fit_mean = blocks // max(blocks_for(math.ceil(mean_seq), block), 1)
    warnings = capacity_warnings(top, fit_mean, max_seqs)
    return CapacityPlan(
        model=str(model_config.get("_name_or_path") or contract.model),
        kv_bytes_per_token=geometry.bytes_per_token,
        kv_cache_bytes=kv_cache_bytes,
        block_size=block,
        cache_blocks=blocks,
        cache_tokens=blocks * block,
        mean_sequence_tokens=round(mean_seq, 1),
        max_sequence_tokens=max_seq,
        sequences_fit_mean=fit_mean,
        sequences_fit_max=sequences_that_fit(kv_cache_bytes, geometry, max_seq, block),
        max_concurrency=top,
        token_budget=budget,
        long_prefill_threshold=threshold,
        iterations=[
            {
                "decode_tokens": p.decode_tokens,
                "prefill_chunks": p.prefill_chunks,
                "leftover": p.leftover,
            }
            for p in plans
        ],
        warnings=warnings,
    )


def describe(plan: CapacityPlan) -> str:
    """The plan as a person reads it (the CLI prints this; --json prints the model)."""
    lines = [
        f"KV cache: {plan.kv_bytes_per_token:,} bytes/token; {plan.kv_cache_bytes / 2**30:.2f} GiB "
        f"= {plan.cache_blocks:,} blocks of {plan.block_size} = {plan.cache_tokens:,} tokens",
        f"sequences that fit: {plan.sequences_fit_mean:,} of mean length "
        f"({plan.mean_sequence_tokens:g} tokens), {plan.sequences_fit_max:,} of the longest "
        f"({plan.max_sequence_tokens:,} tokens); contract's top concurrency {plan.max_concurrency}",
        f"iteration budget {plan.token_budget:,} tokens, long-prefill threshold "
        f"{plan.long_prefill_threshold or 'none'}; a burst of {plan.max_concurrency} requests:",
    ]
    for i, it in enumerate(plan.iterations):
        chunks = it["prefill_chunks"]
        shown = ", ".join(map(str, chunks[:6])) + (" …" if len(chunks) > 6 else "")
        lines.append(
            f"  iter {i}: {it['decode_tokens']} decode + {sum(chunks):,} prefill "
            f"[{shown}] → {it['leftover']:,} unused"
        )
    lines += [f"warning: {w}" for w in plan.warnings]
    return "\n".join(lines)


def read_model_config(model_dir: Path) -> dict[str, Any]:
    return json.loads((model_dir / "config.json").read_text())
