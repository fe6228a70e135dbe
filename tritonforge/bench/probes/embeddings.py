"""vllm_embedding_model: one request of 32 inputs against 32 single-input requests.

Why: the embedding model is non-decoupled behind Triton's dynamic batcher and embeds a
whole batch in one engine call (tritonforge/triton/embedding.py), so that many inputs
cost less together than one by one. This measures that through the path users call,
``POST /v1/embeddings`` with the ``openai`` SDK, on the OpenAI frontend in front of a
tritonserver of its own that serves only vllm_embedding_model. Arms, in interleaved
rounds with the order rotated every round:

* ``batch``: one request whose ``input`` is 32 texts;
* ``singles``: 32 requests of one text each, one after another;
* ``concurrent``: 32 requests of one text each, all sent at once (no target: what a
  client that does not batch gets from Triton's dynamic batcher).

Every arm of every round embeds 32 texts of its own (``--words`` random words each), so
no text is embedded twice. Per round: the foreign CPU share (tritonforge.bench.noise).

    python -m tritonforge.bench.probes.embeddings --rounds 5

Writes ``perf/results/embeddings/<UTC timestamp>/results.json`` (the server log goes to
a temporary directory: it names this machine's paths). The rule, judged per round by the
project's rule (tritonforge.bench.results.judge): the 32 singles' wall time ÷ the batch's
> 1, i.e. a batch of 32 costs less than 32 single calls.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from tritonforge.bench.environment import tritonserver_version
from tritonforge.bench.noise import MAX_FOREIGN_CPU_SHARE, all_quiet
from tritonforge.bench.probes.harness import interleaved, model_dir, probe_environment, save
from tritonforge.bench.results import target_row
from tritonforge.bench.workload import random_words
from tritonforge.launch.launcher import OpenAIFrontend, TritonServer

MODEL = "vllm_embedding_model"
ARMS = ("batch", "singles", "concurrent")


def run_arm(arm: str, base_url: str, texts: list[str]) -> dict[str, Any]:
    """One arm's wall time and the tokens the model embedded."""
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    start = time.perf_counter()
    if arm == "batch":
        answers = [client.embeddings.create(model=MODEL, input=texts)]
    elif arm == "singles":
        answers = [client.embeddings.create(model=MODEL, input=t) for t in texts]
    else:
        answers = asyncio.run(concurrent(base_url, texts))
    wall = time.perf_counter() - start
    vectors = sum(len(a.data) for a in answers)
    assert vectors == len(texts), (arm, vectors)
    tokens = sum(a.usage.prompt_tokens for a in answers)
    return {"wall_s": round(wall, 4), "requests": len(answers), "prompt_tokens": tokens}


async def concurrent(base_url: str, texts: list[str]) -> list[openai.types.CreateEmbeddingResponse]:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    try:
        return list(
            await asyncio.gather(*(client.embeddings.create(model=MODEL, input=t) for t in texts))
        )
    finally:
        await client.close()


def measure(base_url: str, opts: argparse.Namespace) -> list[dict[str, Any]]:
    """Every arm once a round, order rotated; each arm embeds texts of its own."""
    rng = random.Random(opts.seed)

    def arm_run(arm: str) -> dict[str, Any]:
        texts = [random_words(rng, opts.words) for _ in range(opts.inputs)]
        return run_arm(arm, base_url, texts)

    return interleaved(list(ARMS), opts.rounds, arm_run, "arm")


def wall(rows: list[dict[str, Any]], arm: str, index: int) -> float:
    return float(next(r["wall_s"] for r in rows if (r["arm"], r["round"]) == (arm, index)))


def targets(rows: list[dict[str, Any]], rounds: int, bound: float) -> list[dict[str, Any]]:
    quiet = all_quiet((r["noise"]["foreign_cpu_share_during"] for r in rows), bound)
    specs = [
        ("32 singles wall / one batch of 32 wall > 1", 1.0, "singles"),
        ("32 concurrent singles wall / one batch of 32 wall (no target)", None, "concurrent"),
    ]
    return [
        target_row(
            text,
            [wall(rows, arm, i) / wall(rows, "batch", i) for i in range(rounds)],
            threshold,
            True,
            quiet,
        )
        for text, threshold, arm in specs
    ]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--inputs", type=int, default=32)
    parser.add_argument("--words", type=int, default=24, help="random words per input")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-foreign-cpu-share", type=float, default=MAX_FOREIGN_CPU_SHARE)
    return parser


def main(argv: list[str] | None = None) -> None:
    opts = build_parser().parse_args(argv)
    record: dict[str, Any] = {
        "environment": probe_environment(model_dir()),
        "model": MODEL,
        "openai_sdk": openai.__version__,
        "settings": vars(opts),
    }
    with tempfile.TemporaryDirectory(prefix="embeddings-bench-") as tmp:
        started = time.monotonic()
        with TritonServer.on_free_ports(
            models=[MODEL], log_path=Path(tmp) / "server.log"
        ) as server:
            record["server_ready_s"] = round(time.monotonic() - started, 1)
            record["environment"]["tritonserver"] = tritonserver_version(server.http_url)
            frontend = OpenAIFrontend.on_free_port(server.grpc_url, log_path=Path(tmp) / "oa.log")
            frontend.start()
            try:
                frontend.wait_ready()
                for arm in ARMS:  # warm-up: first requests pay one-off costs
                    run_arm(arm, frontend.base_url, ["warm up", "warm up too"])
                record["rows"] = measure(frontend.base_url, opts)
            finally:
                frontend.stop()
    record["targets"] = targets(record["rows"], opts.rounds, opts.max_foreign_cpu_share)
    print(json.dumps(record["targets"], indent=1))
    save(record, "embeddings")


if __name__ == "__main__":
    main()
