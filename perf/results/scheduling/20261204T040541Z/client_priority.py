"""Refusal latency at 2 x S with the client at the default vs real-time priority, and
vLLM's engine processes at nice 0 vs N; one server, cells interleaved, order rotated.

    NICE=19 RATE=8 WARM=20 DUR=100 ROUNDS=2 [CLIENT_RT=1] .venv/bin/python <this file>

CLIENT_RT=1 switches the driver's thread to SCHED_FIFO 10 after the server is up (its
probe process, spawned later, inherits it). Uses perf/overload_run.py's cells.
"""

import json
import os
import sys
import tempfile
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[4]
sys.path[:0] = [str(REPO / "perf"), str(REPO)]
import overload_run as o  # noqa: E402

from tritonforge.bench.contract import load_contract  # noqa: E402
from tritonforge.bench.workload import PromptBuilder  # noqa: E402
from tritonforge.launch.launcher import TritonServer  # noqa: E402
from tritonforge.paths import CACHE_DIR  # noqa: E402

NICE = int(os.environ.get("NICE", "10"))
RATE = float(os.environ.get("RATE", "8"))
WARM = float(os.environ.get("WARM", "30"))
DUR = float(os.environ.get("DUR", "120"))
ROUNDS = int(os.environ.get("ROUNDS", "2"))


def engine_processes(server_pid: int) -> list[psutil.Process]:
    """vLLM's processes under the admission-on model's stub (EngineCore, Worker, helpers)."""
    found = []
    for stub in psutil.Process(server_pid).children(recursive=True):
        if "vllm_model_on" in " ".join(stub.cmdline()):
            found += stub.children(recursive=True)
    return found


def renice(processes: list[psutil.Process], value: int) -> int:
    """Every thread of ``processes`` to nice ``value``; how many threads."""
    count = 0
    for process in processes:
        for thread in process.threads():
            try:
                os.setpriority(os.PRIO_PROCESS, thread.id, value)
                count += 1
            except OSError:
                pass
    return count


def main() -> None:
    contract, _ = load_contract(REPO / "perf/contracts/overload.yaml")
    prompts = PromptBuilder.for_model(CACHE_DIR / "models" / contract.model)
    with (
        tempfile.TemporaryDirectory() as tmp,
        TritonServer.on_free_ports(
            repository=o.repository("vllm_model", Path(tmp)),
            models=["vllm_model_on"],
            log_path=Path(tmp) / "server.log",
        ) as server,
    ):
        if os.environ.get("CLIENT_RT"):
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        for r in range(ROUNDS):
            for j, nice in enumerate([0, NICE] if r % 2 == 0 else [NICE, 0]):
                renice(engine_processes(server.process.pid), nice)
                probes = o.Probes()
                arrivals = o.schedule(contract, prompts, RATE, WARM, DUR, 1000 * r + j)
                outcomes = o.cell(server, "vllm_model_on", arrivals, WARM, DUR, probes)
                summary = o.summary(outcomes, contract, DUR)
                print(json.dumps({"round": r, "nice": nice, **summary, **probes.summary()}))


if __name__ == "__main__":
    main()
