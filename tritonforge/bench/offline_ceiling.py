"""The offline ceiling: vLLM's engine with no server, over every level, in one subprocess.

It cannot be interleaved with the served targets (it needs the cores the servers
hold), so it runs alone once they have stopped, its rounds back to back, and no
comparison with it gets a verdict. Its records go through the same summary as every
other target's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tritonforge.bench.contract import Target
from tritonforge.bench.metrics import MeasuredRequest
from tritonforge.bench.noise import QUIET_WINDOW_S, NoiseSample, RoundWatch
from tritonforge.bench.results import LevelFailure, TargetResult
from tritonforge.bench.services import load_engine_settings
from tritonforge.launch.launcher import server_environment
from tritonforge.paths import REPO_ROOT

if TYPE_CHECKING:
    from tritonforge.bench.runner import Runner

OFFLINE_STARTUP_ALLOWANCE_S = 300.0
NOTE = (
    "ran alone after the servers stopped (its rounds back to back, not interleaved with "
    "the other targets): comparisons with it get no verdict; its noise figures cover the "
    "whole offline job"
)


class OfflineCeiling:
    """Runs one offline target for a :class:`~tritonforge.bench.runner.Runner`'s plan."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.plan = runner.plan

    def run(self, target: Target) -> TargetResult:
        """Every level and round in one engine job; its records, or why there are none."""
        result = TargetResult(
            name=target.name,
            kind=target.kind.value,
            tool="vllm.LLMEngine",
            status="ok",
            load_average_1m=os.getloadavg()[0],
            interleaved=False,
            notes=[NOTE],
        )
        if self.plan.contract.load.mode != "concurrency":
            result.status, result.error = "failed", "the offline ceiling needs concurrency levels"
            self.runner.step(target.name, advance=self.runner.per_target_steps)
            return result
        work = self.plan.scratch / target.name
        work.mkdir(parents=True, exist_ok=True)
        try:
            job = self.job(target)
        except (OSError, ValueError) as error:
            return self.runner.failed(target, f"engine settings: {error}")
        job_path, out_path = work / "job.json", work / "records.json"
        job_path.write_text(json.dumps(job))
        log = self.plan.run_dir / "logs" / f"{target.name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self.runner.step(f"{target.name}: engine start + {len(self.plan.levels)} levels")
        with RoundWatch(QUIET_WINDOW_S) as watch:
            code = self.run_engine(job_path, out_path, log)
        if code == 0 and out_path.is_file():
            try:
                self.record(result, json.loads(out_path.read_text()), watch.sample)
                return self.runner.settle(result)
            except (ValueError, KeyError, TypeError) as error:
                why = f"wrote an unreadable {out_path.name} ({type(error).__name__}: {error})"
        else:
            why = "timed out" if code is None else f"exited with code {code}"
        tail = log.read_text(errors="replace")[-1500:]
        return self.runner.failed(target, f"offline engine {why}; log tail:\n{tail}")

    def job(self, target: Target) -> dict[str, Any]:
        """What ``tritonforge.bench.offline`` runs: engine settings, sampling, workload files."""
        contract = self.plan.contract
        return {
            "engine_settings": load_engine_settings(REPO_ROOT / str(target.engine_config)),
            "sampling": contract.sampling.model_dump(),
            "warmup": str(self.plan.warmup.workload) if self.plan.warmup else None,
            "max_duration_s": contract.load.max_duration_s,
            "levels": [
                {
                    "level": lv.level,
                    "round": r,
                    "workload": str(self.plan.round_load(lv, r, target.name).workload),
                }
                for r in range(contract.load.rounds)
                for lv in self.plan.levels
            ],
        }

    def run_engine(self, job_path: Path, out_path: Path, log: Path) -> int | None:
        """Run the job in its own session; its exit code, or None if it outran its time."""
        load = self.plan.contract.load
        timeout = OFFLINE_STARTUP_ALLOWANCE_S + load.max_duration_s * (
            len(self.plan.levels) * load.rounds + 1
        )
        command = [sys.executable, "-m", "tritonforge.bench.offline", str(job_path), str(out_path)]
        try:
            with log.open("wb") as out:
                proc = subprocess.run(
                    command,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=server_environment(),
                    cwd=REPO_ROOT,
                    timeout=timeout,
                    check=False,
                    start_new_session=True,
                )
        except subprocess.TimeoutExpired:
            return None
        return proc.returncode

    def record(
        self, result: TargetResult, data: dict[str, Any], noise: NoiseSample | None = None
    ) -> None:
        """The offline run's output: a level with records is measured, one without failed."""
        result.startup_s = data["startup_s"]
        result.notes += data["notes"]
        for level in data["levels"]:
            records = [MeasuredRequest(**r) for r in level["records"]]
            round_ = int(level.get("round", 0))
            where = f"{level['level']:g} round {round_ + 1}"
            if level["error"] and not records:
                result.failed_levels[where] = LevelFailure(error=level["error"])
            else:
                if level["error"]:
                    result.notes.append(f"level {where}: {level['error']}")
                self.runner.record(result, level["level"], records, round_, noise)
            self.runner.step(result.name, advance=1)
