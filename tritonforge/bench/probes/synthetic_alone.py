"""CPU per token of the synthetic engine alone (no runtime, no Triton), unpaced.

The serving-ceiling contract charges a stub with the runtime's work and the synthetic
engine's own (drawing a token, detokenizing it, handing it over); this separates the
second. One process, one event loop, ``concurrency`` requests of ``tokens`` tokens
consumed as the runtime would (``async for``), CPU from ``time.process_time``.

    python -m tritonforge.bench.probes.synthetic_alone [--rounds 3] > result.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

from tritonforge.engines.base import PreparedPrompt
from tritonforge.engines.synthetic import SyntheticEngine
from tritonforge.launch.model_store import models_dir
from tritonforge.serving.sampling import SamplingParams


async def level(engine: SyntheticEngine, concurrency: int, tokens: int) -> float:
    """CPU µs per token for one wave of ``concurrency`` requests."""
    prompt = PreparedPrompt(tuple(engine.tokenize("A prompt of a few words.", True)))
    sampling = SamplingParams(max_tokens=tokens, ignore_eos=True)

    async def one(index: int) -> int:
        return sum([len(o.token_ids) async for o in engine.generate(str(index), prompt, sampling)])

    start = time.process_time()
    counts = await asyncio.gather(*(one(i) for i in range(concurrency)))
    return (time.process_time() - start) * 1e6 / sum(counts)


async def main(rounds: int, tokens: int) -> dict:
    tokenizer = Path(os.environ.get("TRITONFORGE_MODELS", models_dir())) / "SmolLM2-135M-Instruct"
    engine = SyntheticEngine.from_settings({"tokenizer": str(tokenizer)})
    await engine.start()
    try:
        await level(engine, 4, tokens)  # warm-up
        results = {}
        for concurrency in (1, 16, 64, 256):
            values = [await level(engine, concurrency, tokens) for _ in range(rounds)]
            results[concurrency] = {
                "cpu_us_per_token_median": statistics.median(values),
                "rounds": values,
            }
    finally:
        await engine.shutdown()
    return {"tokens_per_request": tokens, "levels": results}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.rounds, args.tokens)), indent=2))
