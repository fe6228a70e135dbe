"""A/B on one server: does lowering the Triton front end's CPU priority shorten vLLM's step?

Run from the repository root with ``.venv/bin/python``. Condition "default": every thread
at nice 0. Condition "front-niced": every thread of tritonserver and of the vllm_model stub
at nice 10; vLLM's EngineCore and Worker stay at 0. Interleaved rounds, order swapped each
round; concurrency 1, streamed gRPC, 32 forced tokens, greedy.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import psutil

from tests.e2e.client import llm_inputs, stream
from tritonforge.launch.launcher import TritonServer

WORDS = "river stone cloud paper lamp garden window music planet forest silver bridge".split()  # noqa: SIM905
ROUNDS, PER_ROUND = int(os.environ.get("ROUNDS", 4)), int(os.environ.get("PER", 3))
SAMPLING = {"temperature": 0, "max_tokens": 32, "ignore_eos": True}


def set_nice(procs: list[psutil.Process], value: int) -> None:
    """Nice is per thread on Linux: set it on every thread of each process."""
    for proc in procs:
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, int(tid), value)


def one(server: TritonServer, rng: random.Random) -> tuple[float, float, int]:
    """One streamed request: (TTFT s, mean gap between responses s, responses)."""
    prompt = " ".join(rng.choice(WORDS) for _ in range(40))
    arrivals: list[float] = []
    start = time.perf_counter()
    result = stream(
        server.grpc_url,
        "vllm_model",
        llm_inputs(prompt, SAMPLING),
        on_response=lambda _i: arrivals.append(time.perf_counter()),
        timeout_s=300,
    )
    assert result.error is None, result.error
    gap = (arrivals[-1] - arrivals[0]) / max(1, len(arrivals) - 1)
    return arrivals[0] - start, gap, len(arrivals)


def main() -> None:
    rng = random.Random(7)
    with TritonServer.on_free_ports(models=["vllm_model"]) as server:
        procs = server.group_processes()
        front = [
            p
            for p in procs
            if p.name() == "tritonserver" or p.name().startswith("triton_python_backend")
        ]
        print("front end:", [(p.pid, p.name()) for p in front], flush=True)
        print("all:", sorted(p.name() for p in procs), flush=True)
        for _ in range(2):
            one(server, rng)  # warm-up
        results: dict[str, list[list[float]]] = {"default": [], "front-niced": []}
        for r in range(ROUNDS):
            order = ["default", "front-niced"] if r % 2 == 0 else ["front-niced", "default"]
            for cond in order:
                set_nice(front, 10 if cond == "front-niced" else 0)
                runs = [one(server, rng) for _ in range(PER_ROUND)]
                results[cond].append([gap for _, gap, _ in runs])
                print(
                    f"round {r} {cond:12s} gap ms {[round(g * 1000, 1) for _, g, _ in runs]}"
                    f" ttft ms {[round(t * 1000) for t, _, _ in runs]}"
                    f" tokens {[n for *_, n in runs]}",
                    flush=True,
                )
        set_nice(front, 0)
    for cond, rounds in results.items():
        medians = [statistics.median(gaps) * 1000 for gaps in rounds]
        print(
            f"{cond:12s} per-round median gap ms: {[round(m, 1) for m in medians]}"
            f"  median {statistics.median(medians):.1f}"
        )
    print(json.dumps({c: [[round(g * 1000, 2) for g in r] for r in v] for c, v in results.items()}))


if __name__ == "__main__":
    main()
