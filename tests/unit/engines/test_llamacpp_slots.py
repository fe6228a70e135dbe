"""Slot choice, prefix reuse by whole blocks and adapter turns for llama.cpp (pure, no model)."""

from __future__ import annotations

from tritonforge.engines.llamacpp_slots import Slot, choose_slot, may_join, reusable_prefix

BLOCK = 4


def test_reuse_is_the_common_prefix_cut_to_whole_blocks() -> None:
    cached = list(range(10))
    assert reusable_prefix(cached, [*range(9), 99], BLOCK) == 8  # 9 shared -> 2 blocks
    assert reusable_prefix(cached, [*range(3), 99, 4, 5, 6, 7, 8], BLOCK) == 0  # 3 shared
    assert reusable_prefix([], list(range(10)), BLOCK) == 0


def test_the_prompts_last_token_is_always_evaluated() -> None:
    # The same 8-token prompt again: its logits are needed, so the last block is redone.
    assert reusable_prefix(list(range(8)), list(range(8)), BLOCK) == 4
    assert reusable_prefix(list(range(12)), list(range(9)), BLOCK) == 8


def test_a_free_slot_with_the_longest_reusable_prefix_wins() -> None:
    prompt = list(range(20))
    slots = [
        Slot(0, cached=list(range(6)), last_used=1),
        Slot(1, cached=list(range(13)), last_used=2),
        Slot(2, cached=list(range(19)), busy=True),
    ]
    slot, reuse = choose_slot(slots, prompt, None, BLOCK)
    assert (slot.seq_id, reuse) == (1, 12)


def test_without_a_reusable_prefix_the_least_recently_used_free_slot_is_taken() -> None:
    slots = [Slot(0, cached=[7, 7], last_used=5), Slot(1, cached=[8], last_used=3)]
    slot, reuse = choose_slot(slots, [1, 2, 3], None, BLOCK)
    assert (slot.seq_id, reuse) == (1, 0)


def test_a_prefix_computed_with_another_adapter_is_not_reused() -> None:
    prompt = list(range(20))
    slots = [Slot(0, cached=prompt, adapter="alpha", last_used=9), Slot(1, last_used=1)]
    assert choose_slot(slots, prompt, "beta", BLOCK) == (slots[1], 0)
    assert choose_slot(slots, prompt, "alpha", BLOCK) == (slots[0], 16)


def test_no_slot_when_all_are_busy() -> None:
    assert choose_slot([Slot(0, busy=True)], [1, 2], None, BLOCK) is None


def test_adapters_take_turns() -> None:
    assert may_join("alpha", "alpha", running=3)
    assert may_join(None, None, running=1)
    assert not may_join("beta", "alpha", running=1)  # waits for alpha's sequences to end
    assert may_join("beta", "alpha", running=0)  # then the context switches
