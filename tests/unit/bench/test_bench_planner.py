"""The capacity planner's arithmetic, on the issue's worked examples and the default model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tritonforge.bench import planner
from tritonforge.bench.contract import load_contract

REPO = Path(__file__).resolve().parents[3]
SMOLLM2_CONFIG = {
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "hidden_size": 576,
    "dtype": "bfloat16",
}


def test_budget_1024_two_decodes_and_a_4096_prefill_at_threshold_512_leaves_510() -> None:
    plan = planner.plan_iteration(
        token_budget=1024, long_prefill_threshold=512, decodes=2, prefills=[4096]
    )
    assert plan.decode_tokens == 2
    assert plan.prefill_chunks == [512]
    assert plan.leftover == 510


def test_a_2048_token_prompt_with_1536_cached_has_512_remaining() -> None:
    assert planner.remaining_prefill(prompt_tokens=2048, cached_tokens=1536) == 512


def test_a_full_prefix_hit_still_computes_the_last_prompt_token() -> None:
    assert planner.remaining_prefill(prompt_tokens=256, cached_tokens=256) == 1


def test_without_a_threshold_one_prefill_may_take_the_whole_budget_left() -> None:
    plan = planner.plan_iteration(1024, 0, decodes=4, prefills=[4096, 100])
    assert plan.prefill_chunks == [1020]
    assert plan.leftover == 0


def test_threshold_spreads_the_budget_over_several_prefills() -> None:
    plan = planner.plan_iteration(2048, 512, decodes=0, prefills=[4096, 300, 4096, 4096, 4096])
    assert plan.prefill_chunks == [512, 300, 512, 512, 212]
    assert plan.leftover == 0


def test_decodes_beyond_the_budget_are_capped() -> None:
    plan = planner.plan_iteration(16, 512, decodes=40, prefills=[100])
    assert (plan.decode_tokens, plan.prefill_chunks, plan.leftover) == (16, [], 0)


def test_kv_bytes_per_token_uses_kv_heads_layers_and_dtype() -> None:
    geometry = planner.KvGeometry.from_config(SMOLLM2_CONFIG)
    # K and V × 30 layers × 3 KV heads × 64 dims × 2 bytes
    assert geometry.bytes_per_token == 23_040


def test_sequences_that_fit_count_whole_blocks() -> None:
    geometry = planner.KvGeometry.from_config(SMOLLM2_CONFIG)
    one_gib = 1 << 30
    # 1 GiB / (23,040 B × 128) = 364 blocks; vLLM CPU reports 46,592 tokens for this model.
    assert planner.cache_blocks(one_gib, geometry, 128) * 128 == 46_592
    # 2,048-token sequences need 16 blocks each.
    assert planner.sequences_that_fit(one_gib, geometry, 2048, 128) == 22
    # 129 tokens already take a second block.
    assert planner.sequences_that_fit(one_gib, geometry, 129, 128) == 182


def test_unknown_kv_dtype_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown KV dtype"):
        planner.KvGeometry.from_config(SMOLLM2_CONFIG, "int3")


def test_a_burst_prefills_first_then_decodes_every_running_sequence() -> None:
    plans = planner.simulate_burst(
        prompts=[600, 600, 600],
        outputs=[4, 4, 4],
        cached=[0, 0, 0],
        token_budget=1024,
        long_prefill_threshold=512,
        max_num_seqs=8,
        iterations=6,
    )
    assert plans[0].prefill_chunks == [512, 512]
    assert (plans[1].decode_tokens, plans[1].prefill_chunks) == (0, [88, 88, 512])
    assert (plans[2].decode_tokens, plans[2].prefill_chunks) == (2, [88])
    assert plans[3].decode_tokens == 3


def test_contract_plan_warns_when_top_concurrency_cannot_fit() -> None:
    contract, _ = load_contract(REPO / "perf" / "contracts" / "chat-mix.yaml")
    small_cache = 64 * 1024 * 1024
    plan = planner.plan_contract(contract, SMOLLM2_CONFIG, small_cache, {"max_num_seqs": 64})
    assert plan.kv_bytes_per_token == 23_040
    assert plan.sequences_fit_mean < plan.max_concurrency == 32
    assert any("expect preemption" in w for w in plan.warnings)
    assert "bytes/token" in planner.describe(plan)
