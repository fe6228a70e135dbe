"""What one log line costs a model's stub through python_backend's logger, against a write.

Why: a Python model logs through ``pb_utils.Logger``, which hands every line from the
stub to tritonserver (the stub's IPC, then Triton's logger), so a line per request is a
per-request cost of the serving path; this is the number behind the per-request line
being off by default (tritonforge/serving/request_log.py).

A Python model of this probe's own, on the real tritonserver, writes ``--lines`` lines
a call by one method — ``log_info``, ``log_verbose`` (at Triton's default log level,
where it is not printed), a write to the stub's stderr, or nothing (the baseline: the
call and the settle alone) — and the probe reads the stub's and tritonserver's CPU from
``/proc`` around each call, a settle after it included so the stub's own sending thread
is counted. Methods interleave, their order rotated each round.

    python -m tritonforge.bench.probes.log_line --rounds 3

Writes ``perf/results/log-line/<UTC timestamp>/results.json``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as http

from tritonforge.bench.probes.harness import interleaved, probe_environment, save
from tritonforge.launch.launcher import TritonServer

METHODS = ("none", "log_info", "log_verbose", "stderr")
LINE = (
    "[tritonforge] request 0123456789abcdef0123456789abcdef: finished, 43 prompt + 256 "
    "output tokens, first token after 12 ms, 120 ms (trace 0123456789abcdef0123456789abcdef)"
)
CONFIG = """backend: "python"
max_batch_size: 0
input [ { name: "LINES" data_type: TYPE_INT64 dims: [ 2 ] } ]
output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
MODEL = f"""import os, sys
import numpy as np
import triton_python_backend_utils as pb_utils

LINE = {LINE!r}
METHODS = {METHODS!r}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            count, method = pb_utils.get_input_tensor_by_name(request, "LINES").as_numpy()
            name = METHODS[int(method)]
            for _ in range(int(count)):
                if name == "log_info":
                    pb_utils.Logger.log_info(LINE)
                elif name == "log_verbose":
                    pb_utils.Logger.log_verbose(LINE)
                elif name == "stderr":
                    sys.stderr.write(LINE + "\\n")
                    sys.stderr.flush()
            pid = pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64))
            responses.append(pb_utils.InferenceResponse([pid]))
        return responses
"""


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def call(client: http.InferenceServerClient, lines: int, method: str) -> int:
    tensor = http.InferInput("LINES", [2], "INT64")
    tensor.set_data_from_numpy(np.array([lines, METHODS.index(method)], dtype=np.int64))
    return int(client.infer("log_probe", [tensor]).as_numpy("PID")[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lines", type=int, default=10000, help="lines a measurement")
    parser.add_argument("--settle-s", type=float, default=1.0)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        version = Path(tmp) / "repository" / "log_probe" / "1"
        version.mkdir(parents=True)
        (version.parent / "config.pbtxt").write_text(CONFIG)
        (version / "model.py").write_text(MODEL)
        server = TritonServer.on_free_ports(
            repository=version.parent.parent, models=["log_probe"], log_path=Path(tmp) / "log"
        )
        server.start()
        try:
            server.wait_ready()
            assert server.process is not None
            client = http.InferenceServerClient(server.http_url)
            stub = call(client, 1, "none")

            def measure(method: str) -> dict[str, Any]:
                before = cpu_s(stub), cpu_s(server.process.pid)  # type: ignore[union-attr]
                call(client, args.lines, method)
                time.sleep(args.settle_s)
                after = cpu_s(stub), cpu_s(server.process.pid)  # type: ignore[union-attr]
                return {
                    "stub_us_per_line": (after[0] - before[0]) / args.lines * 1e6,
                    "tritonserver_us_per_line": (after[1] - before[1]) / args.lines * 1e6,
                }

            rows = interleaved(METHODS, args.rounds, measure, label="method")
        finally:
            server.stop()

    record = {
        "probe": "log_line",
        "load": {"lines": args.lines, "settle_s": args.settle_s, "line_chars": len(LINE)},
        "environment": probe_environment(),
        "rows": rows,
    }
    save(record, "log-line")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
