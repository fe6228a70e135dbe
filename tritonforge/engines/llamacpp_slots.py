"""Which request runs in which llama.cpp sequence slot, and how much of its prompt is cached.

Pure bookkeeping for :mod:`tritonforge.engines.llamacpp` (no llama.cpp here, so it is
unit-tested alone). The context holds ``n_parallel`` sequences (slots), each with its
own KV cells for the model's full context. A slot that finishes keeps the KV of its
prompt, so the next request whose prompt starts the same way (a chat's next turn, a
shared system prompt) is placed in that slot and evaluates only the rest, as
llama-server's slots do.

Reuse is by whole prompt blocks. A prompt is evaluated in blocks of :data:`PROMPT_BLOCK`
tokens aligned to position 0, each in a llama.cpp call of its own, and a cached prefix
is reused only up to a block boundary. The tokens after the reuse point are then
evaluated in exactly the calls a cold run makes for them, so the answer does not depend
on what the cache held: on CPUs whose kernels round differently by batch size (seen on
AVX2 hosts) reusing a prefix up to an arbitrary token would change the last bits of the
logits, and a seeded request would not always reproduce. Generated tokens are never
reused for the same reason (they were evaluated one per call).

A LoRA adapter is set on the whole context, so the running sequences share one. The
queue is served by priority, first come first served within one; when its first
request needs another adapter, no further request joins until the running ones finish,
then the context switches: adapters take turns and none waits behind a stream of others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

#: Tokens per prompt evaluation call, and the granularity of prefix reuse.
PROMPT_BLOCK = 64


@dataclass
class Slot:
    """One llama.cpp sequence id and the prompt KV it holds."""

    seq_id: int
    cached: list[int] = field(default_factory=list)  # prompt tokens whose KV the slot holds
    adapter: str | None = None  # the adapter that KV was computed with
    busy: bool = False
    last_used: int = 0  # a tick, for least-recently-used eviction


def reusable_prefix(cached: Sequence[int], prompt: Sequence[int], block: int = PROMPT_BLOCK) -> int:
    """Tokens of ``prompt`` a slot holding ``cached`` can keep: whole blocks, and never
    the prompt's last token (its logits are needed, so it is always evaluated)."""
    limit = min(len(cached), len(prompt) - 1)
    common = 0
    while common < limit and cached[common] == prompt[common]:
        common += 1
    return common - common % block


def choose_slot(
    slots: Sequence[Slot], prompt: Sequence[int], adapter: str | None, block: int = PROMPT_BLOCK
) -> tuple[Slot, int] | None:
    """A free slot for ``prompt`` and how many tokens of it are cached there.

    The free slot with the longest reusable prefix of the same adapter wins; with none,
    the least recently used free slot (the cache most likely stale). None if all are busy.
    """
    free = [slot for slot in slots if not slot.busy]
    if not free:
        return None
    best, best_reuse = min(free, key=lambda slot: slot.last_used), 0
    for slot in free:
        reuse = reusable_prefix(slot.cached, prompt, block) if slot.adapter == adapter else 0
        if reuse > best_reuse:
            best, best_reuse = slot, reuse
    return best, best_reuse


def may_join(wanted: str | None, on_context: str | None, running: int) -> bool:
    """Whether the oldest waiting request may start now, given the context's adapter.

    It may when nothing runs (the context then switches to its adapter) or when it
    needs the adapter already set; otherwise it waits, and so does everyone behind it.
    """
    return running == 0 or wanted == on_context


def spare_slots(slots: Sequence[Slot], taken: Slot, count: int) -> list[Slot] | None:
    """``count`` free slots besides ``taken``, least recently used first; None if fewer.

    A request for n sequences runs in n slots at once: its prompt is evaluated in
    ``taken`` and copied into these, whose own caches are the stalest to give up.
    """
    free = sorted(
        (slot for slot in slots if not slot.busy and slot is not taken),
        key=lambda slot: slot.last_used,
    )
    return free[:count] if len(free) >= count else None
