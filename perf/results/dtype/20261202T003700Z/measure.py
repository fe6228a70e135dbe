"""Offline vLLM on this host: bfloat16 (model.json's) vs float32, same prompts, greedy.

Run from the repository root with ``.venv/bin/python``. Each dtype runs in its own
process (one engine at a time); rounds alternate the order. Prints, for a batch of 1 and
of 16, the prefill seconds and the decode step in milliseconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, random, sys, time
from vllm import LLM, SamplingParams
args = json.loads(sys.argv[1])
llm = LLM(**args)
words = "river stone cloud paper lamp garden window music planet forest silver bridge".split()
rng = random.Random(int(sys.argv[2]))

def prompts(n):
    return [" ".join(rng.choice(words) for _ in range(48)) for _ in range(n)]

def timed(batch, **sampling):
    started = time.perf_counter()
    result = llm.generate(prompts(batch), SamplingParams(temperature=0, **sampling), use_tqdm=False)
    return time.perf_counter() - started, result

timed(1, max_tokens=4)  # warm-up
out = {}
for batch in (1, 16):
    pre, _ = timed(batch, max_tokens=1)
    full, result = timed(batch, max_tokens=33, ignore_eos=True)
    out[batch] = {
        "prefill_s": round(pre, 2),
        "gen33_s": round(full, 2),
        "step_ms": round((full - pre) / 32 * 1000, 1),
        "tokens": sum(len(o.outputs[0].token_ids) for o in result),
    }
print("RESULT" + json.dumps(out))
"""


def main() -> None:
    repo = Path(__file__).resolve().parents[4]
    sys.path.insert(0, str(repo))
    from tritonforge.engines.config import load_engine_config, resolve_paths
    from tritonforge.launch.launcher import server_environment

    env = server_environment()
    os.environ["TRITONFORGE_MODELS"] = env["TRITONFORGE_MODELS"]
    version_dir = repo / "model_repository/vllm_model/1"
    base = resolve_paths(load_engine_config(version_dir, "model.json"), version_dir, ("model",))
    base.pop("disable_log_stats", None)
    print("engine args:", base, flush=True)
    for r in range(int(os.environ.get("ROUNDS", 2))):
        order = ["bfloat16", "float32"] if r % 2 == 0 else ["float32", "bfloat16"]
        for dtype in order:
            proc = subprocess.run(
                [sys.executable, "-c", CHILD, json.dumps({**base, "dtype": dtype}), str(r)],
                env={**env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
                capture_output=True,
                text=True,
                timeout=1800,
            )
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT")), None)
            print(f"round {r} {dtype}: {line[6:] if line else proc.stderr[-2000:]}", flush=True)


if __name__ == "__main__":
    main()
