"""n sequences of one request on llama.cpp: its prompt is evaluated once and copied into
n slots, each sequence samples on its own. The real GGUF in process, no server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.unit.engines.llamacpp_in_process import run, shipped_engine
from tritonforge.engines.base import EngineOutput, PreparedPrompt
from tritonforge.engines.llamacpp import LlamaCppEngine
from tritonforge.engines.llamacpp_slots import Slot, spare_slots
from tritonforge.serving.sampling import SamplingParams

PROMPT = "The three primary colours are"


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaCppEngine]:
    with shipped_engine(n_parallel=3) as engine:
        yield engine


async def outputs(engine: LlamaCppEngine, sampling: SamplingParams) -> list[EngineOutput]:
    ids = tuple(engine.tokenize(PROMPT, add_special_tokens=True))
    return [o async for o in engine.generate(uuid.uuid4().hex, PreparedPrompt(ids), sampling)]


def by_sequence(deltas: list[EngineOutput], n: int) -> list[tuple[str, int, str | None]]:
    """Each sequence's (text, tokens, finish reason)."""
    return [
        (
            "".join(d.text for d in deltas if d.index == i),
            sum(len(d.token_ids) for d in deltas if d.index == i),
            next((d.finish_reason for d in deltas if d.index == i and d.finished), None),
        )
        for i in range(n)
    ]


def test_n_sequences_each_run_to_their_own_end(engine: LlamaCppEngine) -> None:
    sampling = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=6, ignore_eos=True)
    sequences = by_sequence(run(engine, outputs(engine, sampling)), 3)
    assert [(tokens, reason) for _, tokens, reason in sequences] == [(6, "length")] * 3


def test_greedy_sequences_from_one_prompt_evaluation_equal_a_request_alone(
    engine: LlamaCppEngine,
) -> None:
    """The copied prompt KV is the prompt's: greedy sequences all answer as one alone."""
    alone = by_sequence(
        run(engine, outputs(engine, SamplingParams(temperature=0, max_tokens=8))), 1
    )
    several = by_sequence(
        run(engine, outputs(engine, SamplingParams(n=2, temperature=0, max_tokens=8))), 2
    )
    assert several == alone * 2


def test_n_starts_only_when_n_slots_are_free() -> None:
    slots = [Slot(0, busy=True), Slot(1, last_used=5), Slot(2, last_used=2), Slot(3)]
    assert spare_slots(slots, slots[3], 2) == [slots[2], slots[1]]  # stalest caches first
    assert spare_slots(slots, slots[3], 3) is None
    assert spare_slots(slots, slots[3], 0) == []
