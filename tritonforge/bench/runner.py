"""Run a contract end to end: build the load, start each target, measure, stop, report.

Targets are grouped by what serves them: every Triton model of the contract is loaded
into one tritonserver, each vLLM reference server and the offline engine run alone.
Groups run one after another, so two engines never share the two cores during a
measurement. A target that fails (server never ready, tool error) is recorded as
failed with the reason and the run goes on; nothing is dropped silently.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from tritonforge.bench import aiperf_driver, perf_analyzer_driver, server_metrics
from tritonforge.bench.contract import Contract, Target, TargetKind, load_contract
from tritonforge.bench.environment import capture, tritonserver_version
from tritonforge.bench.metrics import MeasuredRequest, summarize
from tritonforge.bench.results import LevelFailure, RunResult, TargetResult, compare
from tritonforge.bench.services import (
    Service,
    TritonService,
    load_engine_settings,
    service_for,
)
from tritonforge.bench.tools import ToolError
from tritonforge.bench.workload import (
    BenchRequest,
    PromptBuilder,
    build_workload,
    write_trace,
    write_workload,
)
from tritonforge.launcher import REPO_ROOT, server_environment

RESULTS_ROOT = REPO_ROOT / "perf" / "results"
WARMUP_STREAM = 10_000
WARMUP_CONCURRENCY = 4
OFFLINE_STARTUP_ALLOWANCE_S = 300.0


@dataclass(frozen=True)
class LevelLoad:
    """The requests of one load level, and the files the tools read them from."""

    level: float
    requests: list[BenchRequest]
    trace: Path
    workload: Path


@dataclass
class RunPlan:
    contract: Contract
    contract_path: Path
    contract_sha256: str
    overrides: list[str]
    model_dir: Path
    run_dir: Path
    scratch: Path
    levels: list[LevelLoad]
    warmup: LevelLoad | None


def model_dir_for(contract: Contract) -> Path:
    from tritonforge.model_store import DEFAULT_MODEL_NAME, ensure_default_model, models_dir

    if contract.model == DEFAULT_MODEL_NAME:
        return ensure_default_model(quiet=True)
    path = models_dir() / contract.model
    if not path.is_dir():
        raise FileNotFoundError(f"model {contract.model!r} not found at {path}")
    return path


def prepare(
    contract_path: Path, overrides: Sequence[str], results_root: Path, console: Console
) -> RunPlan:
    """Validate the contract and write every level's workload before any server starts."""
    contract, digest = load_contract(contract_path, list(overrides))
    model_dir = model_dir_for(contract)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    run_dir = results_root / contract.name / stamp
    scratch = results_root / contract.name / "scratch" / stamp
    run_dir.mkdir(parents=True, exist_ok=True)
    console.print(
        f"[bold]{contract.name}[/]: building the workload from {model_dir.name}'s tokenizer"
    )
    builder = PromptBuilder.for_model(model_dir)

    def level_load(level: float, stream: int, n: int, tag: str) -> LevelLoad:
        requests = build_workload(contract, builder, n, stream=stream)
        return LevelLoad(
            level=level,
            requests=requests,
            trace=write_trace(requests, scratch / "workload" / f"{tag}.jsonl"),
            workload=write_workload(requests, scratch / "workload" / f"{tag}.json"),
        )

    levels = [
        level_load(lv, i, contract.load.count_for(lv), f"level-{lv:g}")
        for i, lv in enumerate(contract.load.levels)
    ]
    warm = contract.load.warmup_requests
    warmup = level_load(float(WARMUP_CONCURRENCY), WARMUP_STREAM, warm, "warmup") if warm else None
    return RunPlan(
        contract,
        contract_path,
        digest,
        list(overrides),
        model_dir,
        run_dir,
        scratch,
        levels,
        warmup,
    )


class Runner:
    """Executes a :class:`RunPlan` with a progress bar; one instance per run."""

    def __init__(self, plan: RunPlan, console: Console) -> None:
        self.plan = plan
        self.console = console
        self.progress = Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} levels"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        total = len(plan.contract.targets) * len(plan.levels)
        self.task = self.progress.add_task("starting", total=total)
        self.tritonserver = "not started in this run"

    def say(self, text: str) -> None:
        self.progress.console.print(text)

    def step(self, text: str, advance: int = 0) -> None:
        self.progress.update(self.task, description=text, advance=advance)

    # --- groups ---------------------------------------------------------------------

    def run(self) -> list[TargetResult]:
        contract = self.plan.contract
        results: dict[str, TargetResult] = {}
        with self.progress:
            triton = [t for t in contract.targets if t.kind is TargetKind.TRITON]
            if triton:
                results |= self.run_served(TargetKind.TRITON, triton)
            for target in contract.targets:
                if target.kind is TargetKind.VLLM_OPENAI:
                    results |= self.run_served(TargetKind.VLLM_OPENAI, [target])
                elif target.kind is TargetKind.VLLM_OFFLINE:
                    results[target.name] = self.run_offline(target)
        return [results[t.name] for t in contract.targets]

    def run_served(self, kind: TargetKind, targets: list[Target]) -> dict[str, TargetResult]:
        logs = self.plan.run_dir / "logs"
        label = ", ".join(t.name for t in targets)
        try:
            service = service_for(kind, targets, logs, served=self.plan.contract.model)
        except (OSError, ValueError) as error:
            return {
                t.name: self.failed(t, f"could not configure the server: {error}") for t in targets
            }
        self.step(f"starting {kind.value} for {label}")
        started = time.monotonic()
        try:
            service.start()
            service.wait_ready()
        except (OSError, ValueError, RuntimeError, TimeoutError) as error:
            service.stop()
            self.say(f"[red]✗ {label}: server did not start[/]")
            return {t.name: self.failed(t, f"server did not start: {error}") for t in targets}
        startup_s = time.monotonic() - started
        self.say(f"{kind.value} ready in {startup_s:.0f} s ({label})")
        if isinstance(service, TritonService):
            self.tritonserver = tritonserver_version(service.server.http_url)
        try:
            return {t.name: self.measure(service, t, startup_s) for t in targets}
        finally:
            self.step(f"stopping {kind.value}")
            service.stop()

    def measure(self, service: Service, target: Target, startup_s: float) -> TargetResult:
        contract = self.plan.contract
        scratch = self.plan.scratch / target.name
        result = TargetResult(
            name=target.name,
            kind=target.kind.value,
            model=target.model,
            tool=target.tool,
            status="ok",
            startup_s=startup_s,
            load_average_1m=os.getloadavg()[0],
        )
        if self.plan.warmup:
            self.step(f"{target.name}: warm-up")
            try:
                self.drive(service, target, self.plan.warmup, scratch / "warmup")
            except ToolError as error:
                self.say(f"[red]✗ {target.name}: warm-up failed[/]")
                result.status, result.error = "failed", f"warm-up failed: {error}"
                self.step(target.name, advance=len(self.plan.levels))
                return result
        for load in self.plan.levels:
            self.step(f"{target.name}: {contract.load.mode} {load.level:g}")
            before = server_metrics.parse(service.metrics_text() or "", target.model)
            try:
                records = self.drive(service, target, load, scratch / f"level-{load.level:g}")
            except ToolError as error:
                result.failed_levels[f"{load.level:g}"] = LevelFailure(
                    error=error.reason, exit_code=error.exit_code, log_tail=error.log_tail
                )
                self.say(f"[red]✗ {target.name} at {load.level:g}[/]: {error.reason}")
                self.step(target.name, advance=1)
                continue
            after = server_metrics.parse(service.metrics_text() or "", target.model)
            moved = server_metrics.delta(before, after)
            if moved:
                result.server_metrics[f"{load.level:g}"] = moved
            self.record(result, load.level, records)
            self.step(target.name, advance=1)
        return self.settle(result)

    def drive(
        self, service: Service, target: Target, load: LevelLoad, artifacts: Path
    ) -> list[MeasuredRequest]:
        """One level (or the warm-up) with the target's tool; ToolError if it yields nothing."""
        contract = self.plan.contract
        warmup = load is self.plan.warmup
        if target.tool == "perf_analyzer":
            if not isinstance(service, TritonService):
                raise ToolError("perf_analyzer needs a Triton target")
            return perf_analyzer_driver.run_level(
                service.server.grpc_url,
                str(target.model),
                load.requests,
                contract.sampling,
                artifacts,
                concurrency=int(load.level),
                max_duration_s=contract.load.max_duration_s,
            )
        endpoint = service.endpoint(target, contract.model, contract.sampling)
        return aiperf_driver.run_level(
            endpoint,
            load.requests,
            load.trace,
            artifacts,
            tokenizer=self.plan.model_dir,
            mode="concurrency" if warmup else contract.load.mode,
            level=load.level,
            max_duration_s=contract.load.max_duration_s,
            seed=contract.seed,
            exact_lengths=contract.sampling.ignore_eos,
        )

    def record(self, result: TargetResult, level: float, records: list[MeasuredRequest]) -> None:
        metrics = summarize(level, records, self.plan.contract.slo)
        result.levels.append(metrics)
        colour = "green" if metrics.errors == 0 else "yellow"
        self.say(
            f"[{colour}]✓ {result.name} at {level:g}[/]: {metrics.output_tok_s:.1f} tok/s, "
            f"TTFT p50 {metrics.ttft_ms.p50 or 0:.0f} ms p95 {metrics.ttft_ms.p95 or 0:.0f} ms, "
            f"TPOT p50 {metrics.tpot_ms.p50 or 0:.1f} ms, "
            f"errors {metrics.errors}/{metrics.requests}"
        )

    @staticmethod
    def settle(result: TargetResult) -> TargetResult:
        if result.failed_levels and not result.levels:
            result.status = "failed"
            result.error = result.error or "every level failed"
        elif result.failed_levels:
            result.status = "partial"
        return result

    def failed(self, target: Target, error: str) -> TargetResult:
        self.step(target.name, advance=len(self.plan.levels))
        return TargetResult(
            name=target.name,
            kind=target.kind.value,
            model=target.model,
            tool=target.tool,
            status="failed",
            error=error,
        )

    # --- offline ceiling ---------------------------------------------------------------

    def run_offline(self, target: Target) -> TargetResult:
        """vLLM's engine without a server over every level, in one subprocess: the ceiling."""
        result = TargetResult(
            name=target.name,
            kind=target.kind.value,
            tool="vllm.LLMEngine",
            status="ok",
            load_average_1m=os.getloadavg()[0],
        )
        if self.plan.contract.load.mode != "concurrency":
            result.status, result.error = "failed", "the offline ceiling needs concurrency levels"
            self.step(target.name, advance=len(self.plan.levels))
            return result
        work = self.plan.scratch / target.name
        work.mkdir(parents=True, exist_ok=True)
        try:
            job = self.offline_job(target)
        except (OSError, ValueError) as error:
            return self.failed(target, f"engine settings: {error}")
        job_path, out_path = work / "job.json", work / "records.json"
        job_path.write_text(json.dumps(job))
        log = self.plan.run_dir / "logs" / f"{target.name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self.step(f"{target.name}: engine start + {len(self.plan.levels)} levels")
        code = self.run_offline_engine(job_path, out_path, log)
        if code == 0 and out_path.is_file():
            try:
                self.record_offline(result, json.loads(out_path.read_text()))
                return self.settle(result)
            except (ValueError, KeyError, TypeError) as error:
                why = f"wrote an unreadable {out_path.name} ({type(error).__name__}: {error})"
        else:
            why = "timed out" if code is None else f"exited with code {code}"
        tail = log.read_text(errors="replace")[-1500:]
        return self.failed(target, f"offline engine {why}; log tail:\n{tail}")

    def offline_job(self, target: Target) -> dict:
        """What ``tritonforge.bench.offline`` runs: engine settings, sampling, workload files."""
        contract = self.plan.contract
        return {
            "engine_settings": load_engine_settings(REPO_ROOT / str(target.engine_config)),
            "sampling": contract.sampling.model_dump(),
            "warmup": str(self.plan.warmup.workload) if self.plan.warmup else None,
            "max_duration_s": contract.load.max_duration_s,
            "levels": [
                {"level": lv.level, "workload": str(lv.workload)} for lv in self.plan.levels
            ],
        }

    def run_offline_engine(self, job_path: Path, out_path: Path, log: Path) -> int | None:
        """Run the job in its own session; its exit code, or None if it outran its time."""
        timeout = OFFLINE_STARTUP_ALLOWANCE_S + self.plan.contract.load.max_duration_s * (
            len(self.plan.levels) + 1
        )
        try:
            with log.open("wb") as out:
                proc = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "tritonforge.bench.offline",
                        str(job_path),
                        str(out_path),
                    ],
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

    def record_offline(self, result: TargetResult, data: dict) -> None:
        """The offline run's output: a level with records is measured, one without failed."""
        result.startup_s = data["startup_s"]
        result.notes += data["notes"]
        for level in data["levels"]:
            records = [MeasuredRequest(**r) for r in level["records"]]
            if level["error"] and not records:
                result.failed_levels[f"{level['level']:g}"] = LevelFailure(error=level["error"])
            else:
                if level["error"]:
                    result.notes.append(f"level {level['level']:g}: {level['error']}")
                self.record(result, level["level"], records)
            self.step(result.name, advance=1)


def run_contract(
    contract_path: Path,
    overrides: Sequence[str] = (),
    results_root: Path = RESULTS_ROOT,
    console: Console | None = None,
) -> Path:
    """Run everything a contract names; return the run directory (results.json, report.md)."""
    from tritonforge.bench import report

    console = console or Console(stderr=True, soft_wrap=True)
    plan = prepare(contract_path, overrides, results_root, console)
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    environment = capture(plan.model_dir)
    runner = Runner(plan, console)
    targets = runner.run()
    environment.tritonserver = runner.tritonserver
    by_name = {t.name: t for t in targets}
    comparisons = [
        row
        for spec in plan.contract.comparisons
        for row in compare(
            spec, by_name[spec.target], by_name[spec.baseline], plan.contract.load.levels
        )
    ]
    try:
        shown_path = str(contract_path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        shown_path = str(contract_path)
    result = RunResult(
        contract_name=plan.contract.name,
        contract_path=shown_path,
        contract_sha256=plan.contract_sha256,
        overrides=plan.overrides,
        contract=plan.contract.model_dump(mode="json", by_alias=True),
        started_at=started,
        finished_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        load_mode=plan.contract.load.mode,
        environment=environment,
        targets=targets,
        comparisons=comparisons,
    )
    (plan.run_dir / "results.json").write_text(result.model_dump_json(indent=2) + "\n")
    report.write(result, plan.run_dir)
    console.print(
        f"results: {plan.run_dir / 'results.json'}\nreport:  {plan.run_dir / 'report.md'}"
    )
    return plan.run_dir
