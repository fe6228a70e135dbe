"""What a traced request costs the runtime's process, by part, off Triton, for one or more commits.

Why: through tritonserver, tracing every request costs a few hundred µs of stub CPU a
request, read only as a difference between two servers' totals. This times the parts in
one process, through the API the runtime calls (``runtime_tracer`` with the real OTLP/HTTP
export to a receiver in a process of its own, as a traced server has it): starting a
request's trace (``begin``: the ``traceparent``, the sampling decision), three sends
through the traced channel, building its spans at its end (``end``; a commit whose
tracer writes a line per request formats it there for a logger that drops it — the
line's way to tritonserver is not in here, see ``log_line``),
and, over all threads, what the process spent per request once every span was exported
(``process``: the parts above plus the spans' encoding and HTTP export on the export
thread). Each commit's code runs from a git worktree of its own in a fresh process, the
commits' order rotated every round; per round, the foreign CPU share. With ``--every N``
one request in N has a sampled parent and the others an unsampled one, so the figures
are a request's average at that sampling (an untraced request costs only ``begin``).

    python -m tritonforge.bench.probes.tracing_parts --rounds 3 1556f91 HEAD
    python -m tritonforge.bench.probes.tracing_parts --rounds 3 --every 100 HEAD

Writes ``perf/results/tracing-parts/<UTC timestamp>/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tritonforge.bench.probes.harness import (
    commit_trees,
    git,
    interleaved,
    probe_environment,
    run_program,
    save,
)

#: Run in the worktree of one commit: argv[1] is the JSON of the load.
PROBE = r"""
import json, sys, time
import numpy as np
load = json.loads(sys.argv[1])
import tritonforge
from tritonforge.engines.base import EngineOutput
from tritonforge.serving.schema import parse_request
from tritonforge.serving.tracing import runtime_tracer

class Drop:
    def log_info(self, msg): pass
    def log_error(self, msg): print(msg, file=sys.stderr)

class Channel:
    def send(self, tensors, error, final): pass
    def is_cancelled(self): return False

env = {"TRITONFORGE_OTLP_ENDPOINT": load["endpoint"], "TRITONFORGE_TRACE_SAMPLING": "1"}
import inspect
if "logger" in inspect.signature(runtime_tracer).parameters:  # its own line, before request_log
    tracer = runtime_tracer("synthetic_unpaced", Drop(), env)
else:
    tracer = runtime_tracer("synthetic_unpaced", env)
sampling = json.dumps({"max_tokens": 256}).encode()
request = parse_request({
    "text_input": np.array([b"Write a long story about a lighthouse keeper."], dtype=np.object_),
    "stream": np.array([True]),
    "sampling_parameters": np.array([sampling], dtype=np.object_),
})
output = EngineOutput(text="", token_ids=[], finish_reason="length")
sampled = load["traceparent"]
unsampled = sampled[:-2] + "00"  # the same caller, its trace not sampled

def one(index, parts):
    traceparent = sampled if index % load["every"] == 0 else unsampled
    t0 = time.thread_time()
    trace = tracer.begin(f"req-{index}", request, traceparent)
    t1 = time.thread_time()
    if trace is None:  # not sampled: the request goes on as an untraced one
        parts[0] += t1 - t0
        return
    channel = trace.channel(Channel())
    channel.send(None, None, False)
    channel.send(None, None, False)
    channel.send(None, None, True)
    t2 = time.thread_time()
    now = time.perf_counter()
    trace.end(now - 0.004, now - 0.003, now - 0.001, 40, 256, output, None, "finished")
    t3 = time.thread_time()
    parts[0] += t1 - t0; parts[1] += t2 - t1; parts[2] += t3 - t2

for index in range(load["warmup"]):
    one(index, [0.0, 0.0, 0.0])
time.sleep(0.5)
parts = [0.0, 0.0, 0.0]
n = load["requests"]
process = time.process_time()
for index in range(n):
    one(index, parts)
tracer.shutdown()  # every span encoded and sent
process = time.process_time() - process
us = lambda seconds: round(seconds / n * 1e6, 2)
print("RESULT" + json.dumps({
    "begin_us": us(parts[0]), "sends_us": us(parts[1]), "end_us": us(parts[2]),
    "process_us": us(process), "imported": tritonforge.__file__,
}))
"""


def probe(tree: Path, load: dict[str, Any]) -> dict[str, Any]:
    """One process running the probe on ``tree``'s code; its result."""
    result = run_program(
        PROBE, [json.dumps(load)], env=os.environ | {"PYTHONPATH": str(tree)}, cwd=tree
    )
    if not Path(result.pop("imported")).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"the probe did not import tritonforge from {tree}")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("commits", nargs="+", help="commits (or refs) to measure")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=5000, help="requests a probe")
    parser.add_argument(
        "--every",
        type=int,
        default=1,
        help="one request in this many has a sampled parent, the others an unsampled one "
        "(100: 1 %% sampling as the frontend decides it); default 1, every request traced",
    )
    opts = parser.parse_args(argv)
    commits = [git("rev-parse", "--short", ref) for ref in opts.commits]
    receiver = subprocess.Popen(
        [sys.executable, "-m", "tritonforge.trace.receiver", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert receiver.stdout is not None
        endpoint = receiver.stdout.readline().split()[-1]  # "receiving traces at <url>"
        load = {
            "requests": opts.requests,
            "every": opts.every,
            "warmup": 500,
            # the OpenAI frontend's span as the parent, as a chat request has it
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        }
        record: dict[str, Any] = {"environment": probe_environment(), "load": load}
        record["commits"] = commits
        with commit_trees(commits, "tracing-parts-") as trees:
            full = load | {"endpoint": endpoint}
            record["rows"] = interleaved(
                commits, opts.rounds, lambda commit: probe(trees[commit], full), "commit"
            )
    finally:
        receiver.terminate()
        receiver.wait(10)
    for commit in commits:
        rows = [r for r in record["rows"] if r["commit"] == commit]
        total = [r["process_us"] for r in rows]
        print(f"{commit}: {min(total)}–{max(total)} µs of process CPU a request")
    save(record, "tracing-parts")


if __name__ == "__main__":
    main()
