"""Where do Triton's extra milliseconds per token go at concurrency 1? Kernel accounting.

Run from the repository root with ``.venv/bin/python``. Two servers on the same engine
settings (``model_repository/vllm_model/1/model.json``) run side by side: tritonserver with
``vllm_model`` (driven over a gRPC stream) and vLLM's own OpenAI server (driven over a
streamed ``/v1/completions``). Interleaved rounds, the order swapped each round; in each,
``PER`` requests at concurrency 1, ~40-word prompts, 32 forced tokens, greedy.

Around each condition the script reads ``/proc/<pid>/task/<tid>/schedstat`` of every
thread of both servers' processes: CPU time and run delay (time runnable but waiting for
a CPU). For vLLM's EngineCore (the process whose main thread schedules and runs each step
on this CPU host) it splits the wall time per token into CPU, run delay and the rest
(asleep: waiting for work). That separates "the engine computes longer per step", "the
engine waits for a CPU" and "the engine waits for something else" — the three readings of
a longer gap between tokens.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
import psutil
import requests

from tests.e2e.client import llm_inputs, stream
from tritonforge.bench.services import VllmOpenAIService
from tritonforge.launch.launcher import TritonServer, session_processes

WORDS = "river stone cloud paper lamp garden window music planet forest silver bridge".split()  # noqa: SIM905
ROUNDS, PER = int(os.environ.get("ROUNDS", 4)), int(os.environ.get("PER", 3))
TOKENS = 32
CONFIG = Path("model_repository/vllm_model/1/model.json")
OUT = Path(__file__).resolve().parent
#: Engine settings merged into model.json for both servers, e.g. '{"x": 1}'; LABEL names
#: the pass in the output file.
OVERRIDES = json.loads(os.environ.get("ENGINE_OVERRIDES", "{}"))
LABEL = os.environ.get("LABEL", "default")


Snapshot = dict[tuple[int, int], tuple[int, int, int]]


def snapshot(pids: list[int]) -> Snapshot:
    """(pid, tid) -> (CPU ns, run-delay ns, timeslices) for every thread of ``pids``."""
    found: Snapshot = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    cpu, delay, slices = map(int, f.read().split())
            except (OSError, ValueError):
                continue
            found[(pid, int(tid))] = (cpu, delay, slices)
    return found


def moved(before: Snapshot, after: Snapshot, keep) -> tuple[int, int, int]:
    """Summed (CPU, delay, slices) over the threads ``keep(pid, tid)`` selects."""
    total = [0, 0, 0]
    for key, now in after.items():
        if keep(*key):
            then = before.get(key, (0, 0, 0))
            for i in range(3):
                total[i] += now[i] - then[i]
    return total[0], total[1], total[2]


def named(procs: list[psutil.Process], title: str) -> list[int]:
    """Pids whose process title (vLLM sets VLLM::EngineCore, VLLM::Worker) has ``title``."""
    return [p.pid for p in procs if title in p.name() + " ".join(p.cmdline())]


def repository(scratch: Path) -> Path:
    """model_repository/, or a copy whose vllm_model settings carry OVERRIDES."""
    if not OVERRIDES:
        return Path("model_repository").resolve()
    copy = scratch / "model_repository"
    shutil.copytree("model_repository", copy)
    settings = copy / "vllm_model" / "1" / "model.json"
    settings.write_text(json.dumps(json.loads(settings.read_text()) | OVERRIDES))
    return copy


def prompt(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(40))


def condition(name: str, r: int, groups: dict, send, rng: random.Random) -> dict:
    """PER requests on one server, with every thread's schedstat read before and after."""
    procs = groups[name]
    (core,) = named(procs, "EngineCore")
    workers = set(named(procs, "VLLM::Worker"))
    pids = [p.pid for p in procs]
    before = snapshot(pids)
    started = time.perf_counter()
    runs = [send(prompt(rng)) for _ in range(PER)]
    wall = time.perf_counter() - started
    after = snapshot(pids)
    tokens = sum(n for _, n in runs)
    main = moved(before, after, lambda pid, tid: tid == core)
    side = moved(before, after, lambda pid, tid: pid == core and tid != core)
    work = moved(before, after, lambda pid, tid: pid in workers)
    rest = moved(before, after, lambda pid, tid: pid != core and pid not in workers)

    def per(ns: float) -> float:
        return round(ns / tokens / 1e6, 2)

    return {
        "round": r,
        "target": name,
        "gap_ms": [round(g * 1000, 1) for g, _ in runs],
        "tokens": tokens,
        "wall_s": round(wall, 2),
        "wall_ms_per_token": per(wall * 1e9),
        "worker_cpu_ms_per_token": per(work[0]),
        "worker_delay_ms_per_token": per(work[1]),
        "engine_core_main_cpu_ms_per_token": per(main[0]),
        "engine_core_main_delay_ms_per_token": per(main[1]),
        "engine_core_other_threads_cpu_ms_per_token": per(side[0]),
        "front_cpu_ms_per_token": per(rest[0]),
        "front_delay_ms_per_token": per(rest[1]),
    }


def triton_one(server: TritonServer, prompt: str) -> tuple[float, int]:
    arrivals: list[float] = []
    sampling = {"temperature": 0, "max_tokens": TOKENS, "ignore_eos": True}
    result = stream(
        server.grpc_url,
        "vllm_model",
        llm_inputs(prompt, sampling),
        on_response=lambda _i: arrivals.append(time.perf_counter()),
        timeout_s=300,
    )
    assert result.error is None, result.error
    return (arrivals[-1] - arrivals[0]) / max(1, len(arrivals) - 1), len(arrivals)


def vllm_one(port: int, prompt: str) -> tuple[float, int]:
    body = {
        "model": "smol",
        "prompt": prompt,
        "max_tokens": TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    arrivals: list[float] = []
    with requests.post(
        f"http://127.0.0.1:{port}/v1/completions", json=body, stream=True, timeout=300
    ) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0].get("text"):
                    arrivals.append(time.perf_counter())
    return (arrivals[-1] - arrivals[0]) / max(1, len(arrivals) - 1), len(arrivals)


def main() -> None:
    rng = random.Random(11)
    scratch = Path(tempfile.mkdtemp(prefix="schedstat-"))
    repo = repository(scratch)
    log = scratch / "vllm-server.log"
    vllm = VllmOpenAIService(repo / "vllm_model" / "1" / "model.json", "smol", log)
    vllm.start()
    try:
        with TritonServer.on_free_ports(models=["vllm_model"], repository=repo) as triton:
            vllm.wait_ready()
            groups = {
                "triton": triton.group_processes(),
                "vllm-server": session_processes(vllm.process.pid),
            }
            print({n: sorted(p.name() for p in ps) for n, ps in groups.items()}, flush=True)
            send = {
                "triton": lambda prompt: triton_one(triton, prompt),
                "vllm-server": lambda prompt: vllm_one(vllm.port, prompt),
            }
            for name in send:  # warm-up
                for _ in range(2):
                    send[name](prompt(rng))
            rows = []
            for r in range(ROUNDS):
                order = list(send) if r % 2 == 0 else list(reversed(send))
                for name in order:
                    row = condition(name, r, groups, send[name], rng)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        vllm.stop()
    summary = {}
    for name in ("triton", "vllm-server"):
        mine = [row for row in rows if row["target"] == name]
        summary[name] = {
            key: statistics.median(
                statistics.median(row[key]) if isinstance(row[key], list) else row[key]
                for row in mine
            )
            for key in mine[0]
            if key not in ("round", "target", "tokens", "wall_s")
        }
    print(json.dumps(summary, indent=1))
    (OUT / f"output-{LABEL}.json").write_text(
        json.dumps({"overrides": OVERRIDES, "rows": rows, "summary": summary}, indent=1)
    )


if __name__ == "__main__":
    main()
