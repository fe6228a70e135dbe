"""Guard benchmark: the numbers behind "Python, not C++" (docs/guard.md).

Measures (1) the guard's pure scanning cost in-process — what guarded_chat pays per
streamed chunk — for a chat-sized and a long text, and per 4-character chunk through
StreamGuard; (2) the `guard` python model's server-side latency with perf_analyzer,
next to the C++ `preprocessing` model's on the same text as the cost of a C++-backend
request here. If the scan is small next to the python backend's per-request cost, a
C++ guard would only save the backend difference, and guarded_chat (which calls the
guard in-process) would gain nothing.

    .venv/bin/python perf/pipelines/bench_guard.py   # -> perf/results/pipelines/guard.md
"""

from __future__ import annotations

import csv
import json
import subprocess
import tempfile
import timeit
from pathlib import Path

from tritonforge.launch.launcher import TritonServer
from tritonforge.paths import REPO_ROOT
from tritonforge.pipelines.guard import StreamGuard, redact

PERF_ANALYZER = REPO_ROOT / ".venv-bench" / "bin" / "perf_analyzer"
SERVER_COLUMNS = (
    "Server Queue",
    "Server Compute Input",
    "Server Compute Infer",
    "Server Compute Output",
)
CHAT = (
    "Hi team, please send the invoice to billing@example.com before Friday. If anything is "
    "unclear call me on +44 20 7946 0958. The refund goes to IBAN GB82 WEST 1234 5698 7654 32, "
    "not to the card ending 1111. We meet on 2024-05-03 at 10:00 in room 3.14; bring the "
    "roadmap, the hiring plan and last quarter's numbers (order 12345678 is still open). Thanks!"
)


def in_process() -> dict[str, float]:
    long_text = " ".join([CHAT] * 8)
    results = {}
    for name, text in (
        (f"chat_{len(CHAT)}_chars", CHAT),
        (f"long_{len(long_text)}_chars", long_text),
    ):
        runs = 200
        seconds = timeit.timeit(lambda t=text: redact(t), number=runs) / runs
        results[f"redact_{name}_us"] = seconds * 1e6

    def stream_chunks() -> int:
        guard = StreamGuard()
        count = 0
        for i in range(0, len(long_text), 4):
            guard.feed(long_text[i : i + 4])
            count += 1
        guard.finish()
        return count

    chunks = stream_chunks()
    seconds = timeit.timeit(stream_chunks, number=20) / 20
    results["stream_guard_per_4_char_chunk_us"] = seconds / chunks * 1e6
    return results


def perf_analyzer(grpc_url: str, model: str, data: Path, out: Path) -> dict[str, float]:
    cmd = [
        str(PERF_ANALYZER), "-m", model, "-u", grpc_url, "-i", "grpc", "--input-data", str(data),
        "--concurrency-range", "1", "--measurement-interval", "3000", "-s", "50",
        "--max-trials", "20", "-f", str(out),
    ]  # fmt: skip
    subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
    row = next(csv.DictReader(out.open()))
    return {
        "server_latency_us": sum(float(row[c]) for c in SERVER_COLUMNS),
        "server_compute_infer_us": float(row["Server Compute Infer"]),
        "client_p50_latency_us": float(row["p50 latency"]),
    }


def main() -> int:
    results: dict[str, object] = {"in_process": in_process()}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data.json"
        data.write_text(json.dumps({"data": [{"text_input": {"content": [CHAT], "shape": [1]}}]}))
        server = TritonServer.on_free_ports(
            models=["guard", "preprocessing"], log_path=Path(tmp) / "server.log"
        )
        server.start()
        try:
            server.wait_ready()
            for model in ("guard", "preprocessing"):
                results[model] = perf_analyzer(
                    server.grpc_url, model, data, Path(tmp) / f"{model}.csv"
                )
        finally:
            server.stop()
    out = REPO_ROOT / "perf" / "results" / "pipelines" / "guard.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
