"""The crash storm's bookkeeping: a crash noticed, blamed on the second before, restarted.

The server is a stand-in process that really dies by SIGSEGV (a real tritonserver crash
is what the storm hunts for and cannot be had on demand); the storm's clients against
the real server run in ``python -m tritonforge.bench.reliability.crash_storm``.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tritonforge.bench.reliability.crash_storm import Storm, _watch, rates, report, storm_models
from tritonforge.launch.launcher import stop_session


@dataclass
class CrashingServer:
    """Its first process dies by SIGSEGV after 0.3 s; later ones run until stopped."""

    log_path: Path
    process: subprocess.Popen | None = None
    starts: int = 0

    def start(self) -> None:
        script = "echo 'Signal (11) received.'; kill -SEGV $$" if not self.starts else "sleep 60"
        self.starts += 1
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                ["sh", "-c", f"sleep 0.3; {script}"], stdout=log, start_new_session=True
            )

    def wait_ready(self) -> None:
        pass

    def stop(self) -> int | None:
        return stop_session(self.process, timeout_s=5) if self.process else None


def test_a_crash_is_recorded_with_the_cancels_before_it_and_the_server_restarted(
    tmp_path,
) -> None:
    server = CrashingServer(tmp_path / "server.log")
    server.start()

    async def scenario() -> Storm:
        storm = Storm(server, ["m"], random.Random(0))  # type: ignore[arg-type]
        storm.serving.set()
        storm.record("mid_stream")
        storm.cancels["before_first"] += 10  # long before: outside the window
        storm.recent.appendleft((time.monotonic() - 5, "before_first"))
        storm.record("around_final")
        stop = asyncio.Event()
        watcher = asyncio.create_task(_watch(storm, stop))
        deadline = time.monotonic() + 20
        while not (storm.crashes and storm.serving.is_set()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        stop.set()
        await watcher
        return storm

    try:
        storm = asyncio.run(scenario())
    finally:
        server.stop()
    [crash] = storm.crashes
    assert crash.cause == "SIGSEGV"
    assert crash.cancels_in_window == {"mid_stream": 1, "around_final": 1}
    assert crash.log_tail == ["Signal (11) received."]
    assert server.starts == 2 and storm.serving.is_set()
    figures = rates(storm)
    assert figures["cancels"] == 12 and figures["crashes"] == 1
    assert figures["by_pattern"]["around_final"]["per_1000"] == 1000.0
    assert figures["by_pattern"]["before_first"]["crashes_with_it_in_window"] == 0
    text = report(
        {
            "started_utc": "T",
            "command": "c",
            "models": ["m"],
            "concurrency": 1,
            "tritonserver": "triton 2.51.0",
            "rates": figures,
            "crashes": [vars(crash)],
        }
    )
    assert "1 crash(es) in 12 cancels" in text and "Signal (11) received." in text


def test_the_storm_loads_what_its_models_call() -> None:
    loaded = storm_models(["ensemble_vllm", "guarded_chat"])
    assert {"preprocessing", "vllm_model", "postprocessing", "guard"} <= set(loaded)
    assert len(loaded) == len(set(loaded))
