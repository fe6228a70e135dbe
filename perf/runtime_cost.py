"""The runtime's own Python per streamed token, off Triton, for one or more commits.

Why: through tritonserver a change of a few µs a token is lost in the rounds' spread
(the floor itself moves by 20 to 30 % between rounds on two cores), yet the serving path is
made of such changes. This measures what this project's code alone costs: the runtime
(``Runtime``: request entry, outbox, response build) over the synthetic engine unpaced,
with every send job run inline on the engine's loop and a channel that takes each
response and drops it. One thread does all the work, so the figure — CPU seconds per
token — counts each part's Python once, without the thread hand-offs and IPC whose cost
depends on the OS scheduler and Triton; it is not what a token costs in the stub. A
wave's requests are submitted in one turn of the engine's loop, so they run together.

Each commit's code runs from a git worktree of its own in a fresh process (the work tree
is not touched), the commits' order rotated every round; per round, the foreign CPU share.

    .venv/bin/python perf/runtime_cost.py --rounds 5 47c8537 HEAD

Writes ``perf/results/runtime-cost/<UTC timestamp>/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tritonforge.bench.environment import capture  # noqa: E402
from tritonforge.bench.noise import RoundWatch  # noqa: E402
from tritonforge.launch.launcher import server_environment  # noqa: E402
from tritonforge.paths import new_run_dir  # noqa: E402

#: Run in the worktree of one commit: argv[1] is the JSON of the load.
PROBE = r"""
import json, os, sys, threading, time
import numpy as np
load = json.loads(sys.argv[1])
import tritonforge
from tritonforge.engines.synthetic import SyntheticEngine
from tritonforge.serving.runtime import Runtime
from tritonforge.serving.schema import parse_request

Runtime._post = lambda self, job: job()  # send jobs inline, on the engine's loop

class Sink:
    def record(self, record): pass
    def set_stats(self, stats): pass
    def log_info(self, msg): pass
    def log_error(self, msg): print(msg, file=sys.stderr)

class Channel:
    def __init__(self, done):
        self.responses, self.done = 0, done
    def send(self, tensors, error, final):
        self.responses += tensors is not None
        if final:
            self.done(error)
    def is_cancelled(self):
        return False

engine = SyntheticEngine.from_settings({
    "tokenizer": load["tokenizer"], "step_ms": 0, "prefill_ms_per_token": 0,
    "output_length": {"dist": "fixed", "value": 100000}, "max_num_seqs": 1024,
})
# Sent inline, a response never waits for a busy sender: one per token, as coalescing off.
runtime = Runtime(engine, Sink(), Sink(), max_inflight=1024)
runtime.start()
sampling = json.dumps({"max_tokens": load["tokens"], "ignore_eos": True}).encode()

def request():
    return parse_request({
        "text_input": np.array([load["prompt"].encode()], dtype=np.object_),
        "stream": np.array([True]),
        "sampling_parameters": np.array([sampling], dtype=np.object_),
    })

def wave():
    left, ended, errors = [load["concurrency"]], threading.Event(), []
    lock = threading.Lock()
    def done(error):
        with lock:
            if error is not None:
                errors.append(repr(error))
            left[0] -= 1
            if left[0] == 0:
                ended.set()
    channels = [Channel(done) for _ in range(load["concurrency"])]
    requests = [request() for _ in channels]

    async def submit_all():  # in one loop turn: the wave's requests start together
        for req, channel in zip(requests, channels):
            runtime.submit(req, channel)

    cpu = time.process_time()
    runtime.run_on_loop(submit_all()).result()
    assert ended.wait(300), "the wave did not end"
    cpu = time.process_time() - cpu
    assert not errors, errors
    tokens = load["concurrency"] * load["tokens"]
    assert sum(c.responses for c in channels) == tokens, "a token was lost or merged"
    return cpu / tokens * 1e6

wave()  # warm-up: the tokenizer's caches, the interpreter's
per_token = [wave() for _ in range(load["waves"])]
runtime.stop()
print("RESULT" + json.dumps({"cpu_us_per_token": per_token, "imported": tritonforge.__file__}))
"""


def probe(tree: Path, load: dict) -> dict:
    """One process running the probe on ``tree``'s code; its result."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(load)],
        cwd=tree, env=os.environ | {"PYTHONPATH": str(tree)},
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT")]
    if not lines:
        raise RuntimeError(done.stderr[-2000:])
    result = json.loads(lines[0][len("RESULT") :])
    if not Path(result.pop("imported")).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"the probe did not import tritonforge from {tree}")
    return result


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("commits", nargs="+", help="commits (or refs) to measure")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=256, help="tokens a request")
    parser.add_argument("--waves", type=int, default=3, help="measured waves per probe")
    parser.add_argument("--prompt", default="Write a long story about a lighthouse keeper.")
    parser.add_argument("--out", type=Path, default=REPO / "perf/results/runtime-cost")
    opts = parser.parse_args()
    env = server_environment()
    model_dir = Path(env["TRITONFORGE_MODELS"]) / "SmolLM2-135M-Instruct"
    load = {
        "tokenizer": str(model_dir),
        "concurrency": opts.concurrency,
        "tokens": opts.tokens,
        "waves": opts.waves,
        "prompt": opts.prompt,
    }
    commits = {ref: git("rev-parse", "--short", ref) for ref in opts.commits}
    # The tokenizer is recorded as the environment's model (its path within the repository).
    recorded_load = {key: value for key, value in load.items() if key != "tokenizer"}
    record: dict = {"environment": capture(model_dir).model_dump(), "load": recorded_load}
    record["rows"] = []
    record["commits"] = list(commits.values())
    with tempfile.TemporaryDirectory(prefix="runtime-cost-") as scratch:
        trees = {}
        for commit in commits.values():
            trees[commit] = Path(scratch) / commit
            git("worktree", "add", "--detach", str(trees[commit]), commit)
        try:
            names = list(trees)
            for index in range(opts.rounds):
                shift = index % len(names)
                for commit in names[shift:] + names[:shift]:
                    with RoundWatch(quiet_window_s=2.0) as watch:
                        result = probe(trees[commit], load)
                    assert watch.sample is not None
                    row = {"round": index, "commit": commit, **result}
                    row["median_us_per_token"] = round(
                        statistics.median(result["cpu_us_per_token"]), 2
                    )
                    record["rows"].append(row | {"noise": watch.sample.model_dump()})
                    print(json.dumps(row), flush=True)
        finally:
            for tree in trees.values():
                git("worktree", "remove", "--force", str(tree))
    for commit in commits.values():
        medians = [r["median_us_per_token"] for r in record["rows"] if r["commit"] == commit]
        print(f"{commit}: {min(medians)}–{max(medians)} µs a token over {len(medians)} rounds")
    out_dir = new_run_dir(opts.out)
    (out_dir / "results.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out_dir / 'results.json'}")


if __name__ == "__main__":
    main()
