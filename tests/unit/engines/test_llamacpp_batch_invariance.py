"""``batch_invariant`` on the real llama.cpp engine and the shipped bfloat16 GGUF, in
process (no server): a sequence's greedy text is the same alone and beside others, and
cancelling one sequence leaves the others' text as it is alone.

Without the setting (the shipped default) llama.cpp evaluates a sequence with no
neighbour slot decoding as a row of its own, with another kernel than a run of several,
so these equalities hold only up to near-ties (tritonforge/engines/llamacpp.py).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest

from tests.unit.engines.llamacpp_in_process import run, shipped_engine
from tritonforge.engines.base import PreparedPrompt
from tritonforge.engines.llamacpp import LlamaCppEngine
from tritonforge.serving.sampling import SamplingParams

PROMPTS = [
    "The three primary colours are",
    "Write a haiku about rain:",
    "Paris is the capital of",
    "List three uses of a paperclip:",
]
GREEDY = SamplingParams(temperature=0, max_tokens=24)


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaCppEngine]:
    with shipped_engine(batch_invariant=True, n_parallel=4) as engine:
        yield engine


async def text(engine: LlamaCppEngine, prompt: str, request_id: str | None = None) -> str:
    ids = tuple(engine.tokenize(prompt, add_special_tokens=True))
    parts = []
    request_id = request_id or uuid.uuid4().hex
    async for output in engine.generate(request_id, PreparedPrompt(ids), GREEDY):
        parts.append(output.text)
    return "".join(parts)


def test_greedy_text_is_the_same_alone_and_beside_others(engine: LlamaCppEngine) -> None:
    alone = [run(engine, text(engine, p)) for p in PROMPTS]

    async def together() -> list[str]:
        return list(await asyncio.gather(*(text(engine, p) for p in PROMPTS)))

    assert run(engine, together()) == alone
    assert len(set(alone)) == len(PROMPTS)  # four different answers, not one repeated


def test_cancelling_one_sequence_leaves_the_others_text_as_alone(engine: LlamaCppEngine) -> None:
    survivors = PROMPTS[:2]
    alone = [run(engine, text(engine, p)) for p in survivors]

    async def with_a_cancel() -> list[str]:
        doomed = asyncio.ensure_future(text(engine, "Tell a very long story:", "doomed"))
        others = [asyncio.ensure_future(text(engine, p)) for p in survivors]
        await asyncio.sleep(0.3)
        await engine.abort("doomed")
        doomed.cancel()
        return list(await asyncio.gather(*others))

    assert run(engine, with_a_cancel()) == alone
