"""Where vLLM's batch-1 decode step goes on this host, next to the floor of the hardware.

Why: one sequence's decode step reads every weight once; how long these cores take to
stream those bytes (and to run the same matrix-vector products in torch) is the floor a
step cannot beat. The engine's step is measured at batch 1 while per-thread CPU
(``/proc/<pid>/task/*/stat``) and py-spy samples are taken of its EngineCore and Worker.

    .venv/bin/python perf/results/profile/20261202T134320Z/measure.py floor
    .venv/bin/python perf/results/profile/20261202T134320Z/measure.py engine --dtype bfloat16 \\
        --out DIR --label NAME [--bind 0-1] [--preload-iomp] [--pyspy] \\
        [--nice-enginecore 19] [--seconds 12]

Run from the repository root. ``floor`` prints JSON; ``engine`` writes
``<out>/<label>.json`` and py-spy's collapsed stacks beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))


def model_dir() -> Path:
    from tritonforge.launch.launcher import server_environment

    return Path(server_environment()["TRITONFORGE_MODELS"]) / "SmolLM2-135M-Instruct"


def floor() -> dict:
    """Seconds to read all weights once (sum) and to run batch-1 linear layers, per dtype."""
    import torch
    from safetensors.torch import load_file

    weights = load_file(str(next(model_dir().glob("*.safetensors"))))
    out: dict = {}
    for dtype in (torch.bfloat16, torch.float32):
        tensors = [w.to(dtype).contiguous() for w in weights.values()]
        matrices = [w for w in tensors if w.dim() == 2]
        nbytes = sum(w.numel() * w.element_size() for w in tensors)
        for threads in (1, 2):
            torch.set_num_threads(threads)
            x = {w.shape[1]: torch.randn(1, w.shape[1], dtype=dtype) for w in matrices}

            def read(tensors=tensors) -> None:
                for w in tensors:
                    w.sum()

            def matvec(matrices=matrices, x=x) -> None:
                for w in matrices:
                    torch.nn.functional.linear(x[w.shape[1]], w)

            row = {}
            for name, fn in (("read", read), ("matvec", matvec)):
                fn()
                wall, cpu = [], []  # CPU time too: a shared machine stretches only the wall
                for _ in range(15):
                    start, start_cpu = time.perf_counter(), time.process_time()
                    fn()
                    wall.append((time.perf_counter() - start) * 1000)
                    cpu.append((time.process_time() - start_cpu) * 1000)
                row[f"{name}_ms"] = round(statistics.median(wall), 2)
                row[f"{name}_cpu_ms"] = round(statistics.median(cpu), 2)
            out[f"{dtype}".removeprefix("torch.") + f"/{threads}t"] = {"MiB": nbytes >> 20, **row}
    return out


CHILD = r"""
import json, statistics, sys, threading, time
from vllm import LLM, SamplingParams
args = json.loads(sys.argv[1])
llm = LLM(**args)
engine = llm.llm_engine
params = SamplingParams(temperature=0, max_tokens=int(sys.argv[2]), ignore_eos=True)
llm.generate(["warm up"], SamplingParams(max_tokens=4), use_tqdm=False)
engine.add_request("r0", "The river runs past the old stone bridge and", params)
steps, ends = [], []
engine.step()
stop = threading.Event()  # the parent says when its sampling window is over
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
print("STEADY", flush=True)
while engine.has_unfinished_requests() and not stop.is_set():
    begin = time.perf_counter()
    engine.step()
    ends.append(time.perf_counter())
    steps.append((ends[-1] - begin) * 1000)
print("RESULT" + json.dumps({"steps": len(steps), "step_ms_median": statistics.median(steps),
      "step_ms_p10": sorted(steps)[len(steps) // 10],
      "step_ms_p90": sorted(steps)[len(steps) * 9 // 10], "ends": ends}), flush=True)
"""


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread of ``pid``, keyed ``name/tid``."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[f"{name}/{task.name}"] = (int(fields[11]) + int(fields[12])) / ticks
    return out


def descendants(pid: int) -> list[tuple[int, str]]:
    import psutil

    return [(p.pid, p.name()) for p in psutil.Process(pid).children(True)]


def child_env(env: dict[str, str], opts: argparse.Namespace) -> dict[str, str]:
    env = {**env, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    if opts.bind:
        env["VLLM_CPU_OMP_THREADS_BIND"] = opts.bind
    if opts.preload_iomp:
        env["LD_PRELOAD"] = str(Path(sys.executable).parents[1] / "lib/libiomp5.so")
    return env


def engine(opts: argparse.Namespace) -> None:
    from tritonforge.engines.config import load_engine_config, resolve_paths
    from tritonforge.launch.launcher import server_environment

    env = server_environment()
    os.environ["TRITONFORGE_MODELS"] = env["TRITONFORGE_MODELS"]
    version = REPO / "model_repository/vllm_model/1"
    args = resolve_paths(load_engine_config(version, "model.json"), version, ("model",))
    args.update(dtype=opts.dtype, enforce_eager=True)
    env = child_env(env, opts)
    tokens = 1900  # outlasts the sampling window; the child stops when told
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(args), str(tokens)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert child.stdout is not None
    for line in child.stdout:
        if line.startswith("STEADY"):
            break
    procs = [(child.pid, "front end (LLM)"), *descendants(child.pid)]
    for pid, name in procs:
        if opts.nice_enginecore and name.startswith("VLLM::EngineCor"):
            os.setpriority(os.PRIO_PROCESS, pid, opts.nice_enginecore)
    from tritonforge.bench.noise import RoundWatch

    with RoundWatch(quiet_window_s=1.0) as watch:
        wall, threads, window = sample(procs, opts)
    assert child.stdin is not None
    child.stdin.write("STOP\n")
    child.stdin.flush()
    result = json.loads(next(line for line in child.stdout if line.startswith("RESULT"))[6:])
    child.wait()
    # CPU per step: load-independent, unlike the wall-clock step on a shared machine.
    ends = [t for t in result.pop("ends") if window[0] <= t <= window[1]]
    cpu_ms_per_step = {
        proc: round(sum(shares.values()) * wall * 1000 / max(len(ends), 1), 2)
        for proc, shares in threads.items()
    }
    record = {
        "label": opts.label,
        "dtype": opts.dtype,
        "bind": opts.bind or "vLLM auto",
        "preload_iomp": opts.preload_iomp,
        "pyspy": opts.pyspy,
        "nice_enginecore": opts.nice_enginecore,
        "window_s": round(wall, 1),
        **result,
        "steps_in_window": len(ends),
        "wall_ms_per_step_in_window": round(wall * 1000 / max(len(ends), 1), 2),
        "cpu_ms_per_step": cpu_ms_per_step,
        "cpu_share_per_thread": threads,
        "noise": watch.sample.model_dump() if watch.sample else None,
    }
    (opts.out / f"{opts.label}.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record))


def sample(procs: list[tuple[int, str]], opts: argparse.Namespace) -> tuple[float, dict, tuple]:
    """py-spy on every process and per-thread CPU shares over ``opts.seconds``."""
    before = {pid: thread_cpu(pid) for pid, _ in procs}
    spies = [
        subprocess.Popen(
            [
                str(Path(sys.executable).parent / "py-spy"),
                "record",
                "--nonblocking",
                "-r",
                "100",
                "-d",
                str(int(opts.seconds)),
                "-f",
                "raw",
                "-p",
                str(pid),
                "-o",
                str(opts.out / f"{opts.label}-{pid}.collapsed.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for pid, _ in procs
        if opts.pyspy
    ]
    start = time.perf_counter()
    time.sleep(opts.seconds)
    after = {pid: thread_cpu(pid) for pid, _ in procs}
    wall = time.perf_counter() - start
    for spy in spies:
        spy.wait()
    threads = {
        f"{pid} {what}": {
            name: round((after[pid].get(name, 0) - used) / wall, 3)
            for name, used in before[pid].items()
            if after[pid].get(name, 0) - used > 0.005 * wall
        }
        for pid, what in procs
    }
    return wall, threads, (start, start + wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=["floor", "engine"])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--bind", default="")
    parser.add_argument("--preload-iomp", action="store_true")
    parser.add_argument("--pyspy", action="store_true", help="also sample with py-spy")
    parser.add_argument("--nice-enginecore", type=int, default=0, help="renice EngineCore")
    parser.add_argument("--seconds", type=float, default=12)
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--label", default="run")
    opts = parser.parse_args()
    if opts.mode == "floor":
        print(json.dumps(floor(), indent=1))
    else:
        opts.out.mkdir(parents=True, exist_ok=True)
        engine(opts)


if __name__ == "__main__":
    main()
