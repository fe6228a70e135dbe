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

    python -m tritonforge.bench.probes.runtime_cost --rounds 5 47c8537 HEAD

Writes ``perf/results/runtime-cost/<UTC timestamp>/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

from tritonforge.bench.probes.harness import (
    commit_trees,
    git,
    interleaved,
    model_dir,
    probe_environment,
    run_program,
    save,
)

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


def probe(tree: Path, load: dict[str, Any]) -> dict[str, Any]:
    """One process running the probe on ``tree``'s code; its result."""
    result = run_program(
        PROBE, [json.dumps(load)], env=os.environ | {"PYTHONPATH": str(tree)}, cwd=tree
    )
    if not Path(result.pop("imported")).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"the probe did not import tritonforge from {tree}")
    result["median_us_per_token"] = round(statistics.median(result["cpu_us_per_token"]), 2)
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("commits", nargs="+", help="commits (or refs) to measure")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=256, help="tokens a request")
    parser.add_argument("--waves", type=int, default=3, help="measured waves per probe")
    parser.add_argument("--prompt", default="Write a long story about a lighthouse keeper.")
    return parser


def main(argv: list[str] | None = None) -> None:
    opts = build_parser().parse_args(argv)
    tokenizer = model_dir()
    load = {
        "concurrency": opts.concurrency,
        "tokens": opts.tokens,
        "waves": opts.waves,
        "prompt": opts.prompt,
    }
    commits = [git("rev-parse", "--short", ref) for ref in opts.commits]
    # The tokenizer is recorded as the environment's model (its path within the repository).
    record: dict[str, Any] = {"environment": probe_environment(tokenizer), "load": load}
    record["commits"] = commits
    with commit_trees(commits, "runtime-cost-") as trees:
        full = load | {"tokenizer": str(tokenizer)}
        record["rows"] = interleaved(
            commits, opts.rounds, lambda commit: probe(trees[commit], full), "commit"
        )
    for commit in commits:
        medians = [r["median_us_per_token"] for r in record["rows"] if r["commit"] == commit]
        print(f"{commit}: {min(medians)}–{max(medians)} µs a token over {len(medians)} rounds")
    save(record, "runtime-cost")


if __name__ == "__main__":
    main()
