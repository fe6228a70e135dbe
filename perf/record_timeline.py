"""Record an engine timeline: when each request arrived, its prompt, when each token came.

Why: SLO admission's predictor (tritonforge/serving/admission.py) is calibrated online
from exactly these events. A timeline recorded from a real engine under open-loop
Poisson arrivals lets its unit tests replay real prefill and decode behaviour, with
queues building and draining, without a server.

    .venv/bin/python perf/record_timeline.py --requests 60 --rate 1.5 \\
        --out tests/unit/serving/data/vllm_timeline.json

The engine is ``model_repository/vllm_model`` (its model.json, through this project's
vLLM adapter, in this process). Prompts are random words of 20-300 tokens, outputs
16-96 tokens (ignore_eos), the short-chat shape. Times are seconds from the first
arrival. No prompt text is written: only token counts and times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import time
from pathlib import Path
from typing import Any

from tritonforge.paths import CACHE_DIR, REPO_ROOT


async def _one(
    engine: Any,
    request_id: str,
    prompt: Any,
    sampling: Any,
    arrival: float,
    t0: float,
    rows: list[dict[str, Any]],
) -> None:
    """Send one request at ``arrival`` seconds after ``t0``; append its timeline row."""
    await asyncio.sleep(max(arrival - (time.perf_counter() - t0), 0))
    arrived = time.perf_counter() - t0
    tokens = []
    async for delta in engine.generate(request_id, prompt, sampling):
        now = time.perf_counter() - t0
        tokens.extend([round(now, 5)] * len(delta.token_ids))
    rows.append(
        {
            "arrival": round(arrived, 5),
            "prompt_tokens": len(prompt.token_ids),
            "token_times": tokens,
        }
    )


async def record(requests: int, rate: float, seed: int) -> dict[str, Any]:
    """Start the engine, send ``requests`` at Poisson ``rate``, return the timeline."""
    from tritonforge.engines.config import load_engine_config
    from tritonforge.engines.vllm import VllmEngine
    from tritonforge.serving.sampling import build_sampling
    from tritonforge.serving.schema import GenerateRequest

    os.environ.setdefault("TRITONFORGE_MODELS", str(CACHE_DIR / "models"))
    version = REPO_ROOT / "model_repository" / "vllm_model" / "1"
    engine = VllmEngine.from_config(load_engine_config(version, "model.json"), version)
    await engine.start()
    rng = random.Random(seed)
    words = [
        "the",
        "cat",
        "sat",
        "on",
        "a",
        "mat",
        "while",
        "rain",
        "fell",
        "over",
        "quiet",
        "hills",
        "and",
        "old",
        "roads",
        "led",
        "far",
        "into",
        "green",
        "valleys",
    ]
    jobs: list[Any] = []
    rows: list[dict[str, Any]] = []
    arrival = 0.0
    t0 = time.perf_counter()
    for i in range(requests):
        arrival += rng.expovariate(rate)
        text = " ".join(rng.choice(words) for _ in range(rng.randint(20, 300)))
        request = GenerateRequest(prompt=text)
        prompt = engine.prepare(request)
        sampling = build_sampling(
            {"max_tokens": rng.randint(16, 96), "ignore_eos": True, "temperature": 0.0}
        )
        jobs.append(_one(engine, f"r{i}", prompt, sampling, arrival, t0, rows))
    await asyncio.gather(*jobs)
    await engine.shutdown()
    rows.sort(key=lambda r: r["arrival"])
    return {
        "engine": "vllm_model",
        "rate_per_s": rate,
        "seed": seed,
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "requests": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--rate", type=float, default=1.5, help="Poisson arrivals per second")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    timeline = asyncio.run(record(args.requests, args.rate, args.seed))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(timeline, indent=1) + "\n")
    print(f"wrote {len(timeline['requests'])} requests to {args.out}")


if __name__ == "__main__":
    main()
