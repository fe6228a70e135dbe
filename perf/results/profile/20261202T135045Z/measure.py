"""Where the serving path's microseconds go: streamed tokens/s and server CPU per response.

Run from the repository root with ``.venv/bin/python``. Starts one tritonserver on a
repository assembled for the run: ``bare_stream`` (perf/floor: Triton's own Python
floor, nothing of tritonforge), ``synthetic_off`` / ``synthetic_on`` (synthetic_model
unpaced, EOS never before max_tokens; coalescing off / on) and ``synthetic_paced``
(10 ms a step), plus the models beside this file (``zero_*``: the runtime over an engine
that yields a token per loop turn; ``zero_old_model`` runs the runtime of ``--old-tree``,
another checkout, for an A/B inside one server). For each round and target (order rotated
each round) it runs ``--concurrency`` asyncio gRPC streams for ``--seconds`` (``--openai``:
also streamed completions through the OpenAI frontend). Per condition: tokens that
arrived (the ``num_output_tokens`` of every response, or the stream's usage), responses,
TTFT and the gap between responses (p50/p99), CPU of tritonserver, of each stub, of the
frontend and of this client (``/proc``), and the share of the machine's cores everything
else used meanwhile. ``--pyspy DIR`` first samples each target's stub with py-spy for a
condition's length (a separate, unmeasured pass) and writes tritonserver's per-thread
CPU. Prints one JSON row per condition.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio

from tritonforge.launch.launcher import OpenAIFrontend, TritonServer
from tritonforge.paths import REPO_ROOT

HERE = Path(__file__).resolve().parent
TICK = os.sysconf("SC_CLK_TCK")


UNPACED = {
    "step_ms": 0,
    "prefill_ms_per_token": 0,
    "output_length": {"dist": "fixed", "value": 2000},
}
SYNTHETIC = {
    "synthetic_off": (UNPACED, {"stream_coalescing": "false"}),
    "synthetic_on": (UNPACED, {}),
    "synthetic_paced": (UNPACED | {"step_ms": 10}, {}),
    "synthetic_paced_off": (UNPACED | {"step_ms": 10}, {"stream_coalescing": "false"}),
}


def assemble_repo(target: Path) -> Path:
    """The run's model repository (see the module docstring)."""
    shutil.copytree(REPO_ROOT / "perf" / "floor" / "bare_stream", target / "bare_stream")
    for model in (HERE / "repo").iterdir():
        shutil.copytree(model, target / model.name)
    source = REPO_ROOT / "model_repository" / "synthetic_model"
    for name, (settings, parameters) in SYNTHETIC.items():
        shutil.copytree(source, target / name)
        engine_json = target / name / "1" / "model.json"
        engine_json.write_text(json.dumps(json.loads(engine_json.read_text()) | settings))
        config = target / name / "config.pbtxt"
        lines = [
            f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}'
            for k, v in parameters.items()
        ]
        config.write_text(config.read_text() + "\n".join(["", *lines, ""]))
    return target


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _stub_model(pid: int) -> str:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    path = next((a.decode() for a in argv if a.endswith(b"model.py")), "?")
    return Path(path).parent.parent.name


def _machine_busy_s() -> float:
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    values = [int(v) for v in fields]
    return (sum(values) - values[3] - values[4]) / TICK  # all but idle and iowait


def _threads(pid: int) -> dict[str, float]:
    result: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat.split("(", 1)[1].rsplit(")", 1)[0]
        result[f"{name} {task.name}"] = _cpu_s_from(stat)  # by thread id, as py-spy names it
    return result


def _cpu_s_from(stat: str) -> float:
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _inputs(tokens: int) -> list[grpcclient.InferInput]:
    def tensor(name: str, value: np.ndarray, dtype: str) -> grpcclient.InferInput:
        t = grpcclient.InferInput(name, list(value.shape), dtype)
        t.set_data_from_numpy(value)
        return t

    sampling = json.dumps({"max_tokens": tokens, "ignore_eos": True})
    return [
        tensor("text_input", np.array([b"hello"], dtype=np.object_), "BYTES"),
        tensor("sampling_parameters", np.array([sampling.encode()], dtype=np.object_), "BYTES"),
        tensor("stream", np.array([True]), "BOOL"),
        tensor("return_num_output_tokens", np.array([True]), "BOOL"),
    ]


async def _one(client, model, inputs, stats) -> None:
    async def requests():
        yield {"model_name": model, "inputs": inputs}

    sent = last = time.perf_counter()
    first = True
    async for result, error in client.stream_infer(requests()):
        now = time.perf_counter()
        if error is not None:
            stats["errors"] += 1
            return
        response = result.get_response()
        raw = response.raw_output_contents
        names = [o.name for o in response.outputs]
        if "num_output_tokens" in names:
            n = int(np.frombuffer(raw[names.index("num_output_tokens")], "<u4").sum())
            if n:
                stats["tokens"] += n
                stats["responses"] += 1
                if first:
                    stats["ttft"].append(now - sent)
                    first = False
                else:
                    stats["gap"].append(now - last)
                last = now
        final = response.parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            return


async def _load(url: str, model: str, concurrency: int, tokens: int, seconds: float) -> dict:
    stats = {"tokens": 0, "responses": 0, "errors": 0, "ttft": [], "gap": []}
    client = grpcaio.InferenceServerClient(url)
    inputs = _inputs(tokens)
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < stop_at:
            await _one(client, model, inputs, stats)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await client.close()
    return stats


async def _one_sse(session, url, model, tokens, stats) -> None:
    body = {
        "model": model,
        "prompt": "hello",
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = last = time.perf_counter()
    first = True
    async with session.post(url, json=body) as response:
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            now = time.perf_counter()
            event = json.loads(line[6:])
            if event.get("usage"):
                stats["tokens"] += event["usage"]["completion_tokens"]
            elif event["choices"] and event["choices"][0]["text"]:
                stats["responses"] += 1
                if first:
                    stats["ttft"].append(now - sent)
                    first = False
                else:
                    stats["gap"].append(now - last)
                last = now


async def _load_openai(base: str, model: str, concurrency: int, tokens: int, seconds: float):
    stats = {"tokens": 0, "responses": 0, "errors": 0, "ttft": [], "gap": []}
    stop_at = time.perf_counter() + seconds
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            while time.perf_counter() < stop_at:
                await _one_sse(session, f"{base}/completions", model, tokens, stats)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return stats


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return round(float(np.percentile(values, q)) * 1000, 3)


def measure(server: TritonServer, model: str, args: argparse.Namespace, frontend=None) -> dict:
    pid = server.process.pid
    stubs = {p: _stub_model(p) for p in _children(pid)}
    procs = [pid, *stubs]
    if frontend is not None:
        procs.append(frontend.process.pid)
    before = {p: _cpu_s(p) for p in procs}
    me0, busy0, t0 = _cpu_s(os.getpid()), _machine_busy_s(), time.perf_counter()
    if frontend is None:
        load = _load(server.grpc_url, model, args.concurrency, args.tokens, args.seconds)
    else:
        load = _load_openai(frontend.base_url, model, args.concurrency, args.tokens, args.seconds)
    stats = asyncio.run(load)
    wall = time.perf_counter() - t0
    used = {p: _cpu_s(p) - before[p] for p in procs}
    me, busy = _cpu_s(os.getpid()) - me0, _machine_busy_s() - busy0
    frontend_s = used.pop(frontend.process.pid) if frontend is not None else 0.0
    server_s = sum(used.values())
    others = busy - server_s - frontend_s - me
    n, r = stats["tokens"], stats["responses"]
    return {
        "model": model,
        "concurrency": args.concurrency,
        "wall_s": round(wall, 2),
        "tokens_per_s": round(n / wall, 1),
        "responses_per_s": round(r / wall, 1),
        "tokens_per_response": round(n / r, 3) if r else None,
        "server_cpu_us_per_response": round(server_s / r * 1e6, 1) if r else None,
        "server_cpu_us_per_token": round(server_s / n * 1e6, 1) if n else None,
        "tritonserver_cpu_s": round(used[pid], 2),
        "stub_cpu_s": {stubs[p]: round(used[p], 2) for p in stubs},
        "client_cpu_s": round(me, 2),
        "path": "grpc" if frontend is None else "openai",
        "frontend_cpu_us_per_token": round(frontend_s / n * 1e6, 1) if frontend else None,
        "others_cpu_share": round(others / (wall * os.cpu_count()), 3),
        "ttft_p50_ms": _pct(stats["ttft"], 50),
        "ttft_p99_ms": _pct(stats["ttft"], 99),
        "gap_p50_ms": _pct(stats["gap"], 50),
        "gap_p99_ms": _pct(stats["gap"], 99),
        "errors": stats["errors"],
    }


def profile(server: TritonServer, model: str, args: argparse.Namespace, out: Path) -> None:
    """py-spy of the model's stub (GIL holders) and per-thread CPU, one condition long."""
    pid = server.process.pid
    stub = next(p for p in _children(pid) if _stub_model(p) == model)
    name = f"{model}-c{args.concurrency}"
    spy = subprocess.Popen(
        [str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(stub),
         "-d", str(int(args.seconds)), "-r", "250", "--threads", "--gil", "-f", "raw",
         "-o", str(out / f"stub-{name}.collapsed.txt")],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    before = {"tritonserver": _threads(pid), "stub": _threads(stub)}
    stats = asyncio.run(_load(server.grpc_url, model, args.concurrency, args.tokens, args.seconds))
    after = {"tritonserver": _threads(pid), "stub": _threads(stub)}
    spy.wait()
    per_thread: dict[str, object] = {"responses": stats["responses"], "tokens": stats["tokens"]}
    for process, threads in after.items():
        used = {k: round(v - before[process].get(k, 0.0), 3) for k, v in threads.items()}
        used = {k: v for k, v in used.items() if v > 0}
        per_thread[f"{process}_cpu_s_by_thread"] = dict(sorted(used.items(), key=lambda kv: -kv[1]))
    (out / f"threads-{name}.json").write_text(json.dumps(per_thread, indent=1) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--targets", default="bare_stream,synthetic_off")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pyspy", type=Path, default=None)
    parser.add_argument(
        "--openai", default="", help="targets also measured through the frontend (comma list)"
    )
    parser.add_argument(
        "--old-tree", type=Path, default=None, help="a checkout whose runtime zero_old_model runs"
    )
    args = parser.parse_args()
    targets = args.targets.split(",")
    if args.old_tree is not None:
        os.environ["HOTPATH_OLD_TREE"] = str(args.old_tree.resolve())
    repo = assemble_repo(Path(tempfile.mkdtemp(prefix="hotpath-")) / "repo")
    server = TritonServer.on_free_ports(
        repository=repo, models=targets, log_path=repo.parent / "tritonserver.log"
    )
    server.start()
    frontend = None
    try:
        server.wait_ready()
        if args.openai:
            frontend = OpenAIFrontend.on_free_port(
                server.grpc_url, log_path=repo.parent / "openai.log"
            )
            frontend.start()
            frontend.wait_ready()
        asyncio.run(_load(server.grpc_url, targets[0], 4, 16, 2.0))  # warm up
        if args.pyspy is not None:
            args.pyspy.mkdir(parents=True, exist_ok=True)
            for model in targets:
                profile(server, model, args, args.pyspy)
        for round_no in range(args.rounds):
            order = targets[round_no % len(targets) :] + targets[: round_no % len(targets)]
            for model in order:
                row = measure(server, model, args) | {"round": round_no}
                print(json.dumps(row), flush=True)
                if frontend is not None and model in args.openai.split(","):
                    row = measure(server, model, args, frontend) | {"round": round_no}
                    print(json.dumps(row), flush=True)
    finally:
        if frontend is not None:
            frontend.stop()
        server.stop()
        shutil.rmtree(repo.parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
