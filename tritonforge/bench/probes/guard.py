"""Guard benchmark: the numbers behind "Python, not C++" (docs/guard.md).

Measures (1) the guard's pure scanning cost in-process — what guarded_chat pays per
streamed chunk — for a chat-sized and a long text, and per 4-character chunk through
StreamGuard; (2) the `guard` python model's server-side latency with perf_analyzer,
next to the C++ `preprocessing` model's on the same text as the cost of a C++-backend
request here. If the scan is small next to the python backend's per-request cost, a
C++ guard would only save the backend difference, and guarded_chat (which calls the
guard in-process) would gain nothing.

    python -m tritonforge.bench.probes.guard   # -> perf/results/pipelines/guard.json
"""

from __future__ import annotations

import functools
import json
import tempfile
import timeit
from pathlib import Path

from tritonforge.bench.perf_analyzer_driver import server_latency
from tritonforge.launch.launcher import TritonServer
from tritonforge.paths import REPO_ROOT
from tritonforge.pipelines.guard import StreamGuard, redact

CHAT = (
    "Hi team, please send the invoice to billing@example.com before Friday. If anything is "
    "unclear call me on +44 20 7946 0958. The refund goes to IBAN GB82 WEST 1234 5698 7654 32, "
    "not to the card ending 1111. We meet on 2024-05-03 at 10:00 in room 3.14; bring the "
    "roadmap, the hiring plan and last quarter's numbers (order 12345678 is still open). Thanks!"
)


def in_process() -> dict[str, float]:
    long_text = " ".join([CHAT] * 8)
    results: dict[str, float] = {}
    for name, text in (
        (f"chat_{len(CHAT)}_chars", CHAT),
        (f"long_{len(long_text)}_chars", long_text),
    ):
        runs = 200
        seconds = timeit.timeit(functools.partial(redact, text), number=runs) / runs
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


def main() -> int:
    results: dict[str, object] = {"in_process": in_process()}
    with tempfile.TemporaryDirectory() as tmp:
        server = TritonServer.on_free_ports(
            models=["guard", "preprocessing"], log_path=Path(tmp) / "server.log"
        )
        server.start()
        try:
            server.wait_ready()
            for model in ("guard", "preprocessing"):
                results[model] = server_latency(
                    server.grpc_url, model, CHAT, Path(tmp), measurement_ms=3000
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
