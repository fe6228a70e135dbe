"""Run a contract end to end: build the load, start each target, measure, stop, report.

Every served target is up at once — one tritonserver for all the Triton models (and the
OpenAI frontend in front of it, for ``openai`` targets), one vLLM reference server each
— and the load runs level by level in interleaved rounds: each level of each target
``load.rounds`` times, the targets' order rotated every round, one target at a time (an
idle engine leaves the cores to the one measured). Drift of a shared machine then
spreads over every target instead of falling on the one measured last, and the rounds'
spread says how far a difference can be trusted. Around each round the foreign CPU
share is recorded (:mod:`tritonforge.bench.noise`). The offline engine runs alone
afterwards. A target that fails (server never ready, tool error) is recorded as failed
with the reason and the run goes on; nothing is dropped silently.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from tritonforge.bench import aiperf_driver, perf_analyzer_driver, saturation, server_metrics
from tritonforge.bench.contract import Contract, Target, TargetKind, load_contract
from tritonforge.bench.environment import (
    Environment,
    ServedCode,
    capture,
    describe_code,
    served_code,
    tritonserver_version,
)
from tritonforge.bench.metrics import MeasuredRequest, summarize
from tritonforge.bench.noise import NoiseSample, RoundWatch
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
from tritonforge.launch.launcher import REPO_ROOT, server_environment

RESULTS_ROOT = REPO_ROOT / "perf" / "results"
WARMUP_STREAM = 10_000
WARMUP_CONCURRENCY = 4
OFFLINE_STARTUP_ALLOWANCE_S = 300.0
QUIET_WINDOW_S = 2.0  # foreign CPU is sampled this long before each round, too
T = TypeVar("T")


@dataclass(frozen=True)
class LevelLoad:
    """The requests of one load level, and the files the tools read them from."""

    level: float
    requests: list[BenchRequest]
    trace: Path
    workload: Path
    stream: int = 0  # the level's seeded stream: its classes and lengths


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
    builder: PromptBuilder | None = None

    def round_load(self, load: LevelLoad, round_: int, target: str) -> LevelLoad:
        """The level's requests with words of their own for this round and target.

        Same classes and lengths as every other target's; other text, so a shared engine's
        prefix cache never serves one target (or round) another's prompts.
        """
        if self.builder is None:
            return load
        tag = f"level-{load.level:g}-round-{round_ + 1}-{target}"
        requests = build_workload(
            self.contract, self.builder, len(load.requests), stream=load.stream, text=tag
        )
        return LevelLoad(
            load.level,
            requests,
            write_trace(requests, self.scratch / "workload" / f"{tag}.jsonl"),
            write_workload(requests, self.scratch / "workload" / f"{tag}.json"),
            load.stream,
        )


def model_dir_for(contract: Contract) -> Path:
    from tritonforge.launch.model_store import DEFAULT_MODEL_NAME, ensure_default_model, models_dir

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
            stream=stream,
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
        builder,
    )


def rotated(items: Sequence[T], by: int) -> list[T]:
    """``items`` starting at position ``by`` (mod length): round r's order of the targets."""
    if not items:
        return []
    k = by % len(items)
    return [*items[k:], *items[:k]]


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
        load = plan.contract.load
        total = len(plan.contract.targets) * len(plan.levels) * load.rounds
        self.task = self.progress.add_task("starting", total=total)
        self.tritonserver = "not started in this run"
        # Called with the served targets' results after each level: run_contract's checkpoint.
        self.on_level_done: Callable[[list[TargetResult]], None] | None = None
        self.results: dict[str, TargetResult] = {}  # by target name, as far as measured

    @property
    def per_target_steps(self) -> int:
        return len(self.plan.levels) * self.plan.contract.load.rounds

    def say(self, text: str) -> None:
        self.progress.console.print(text)

    def step(self, text: str, advance: int = 0) -> None:
        self.progress.update(self.task, description=text, advance=advance)

    # --- served targets, interleaved ------------------------------------------------------

    def run(self) -> list[TargetResult]:
        """Every served target up at once, measured in rotated rounds; then the offline ones."""
        contract = self.plan.contract
        results = self.results
        with self.progress:
            services, started = self.start_services(results)
            try:
                live = [t for t in contract.targets if t.name in services]
                for target in live:
                    results[target.name] = self.warm_up(
                        services[target.name], target, started[target.name]
                    )
                self.run_rounds(
                    services, [t for t in live if results[t.name].status == "ok"], results
                )
            finally:
                self.step("stopping the servers")
                for service in {id(s): s for s in services.values()}.values():
                    service.stop()
            for target in contract.targets:
                if target.kind is TargetKind.VLLM_OFFLINE:
                    results[target.name] = self.run_offline(target)
        return [self.settle(results[t.name]) for t in contract.targets]

    def start_services(
        self, results: dict[str, TargetResult]
    ) -> tuple[dict[str, Service], dict[str, float]]:
        """Start the servers of every served target at once: one Triton for all its models.

        They must all be up together for the rounds to interleave; an idle engine does not
        compete for the CPU. A server that fails to start fails its targets, not the run.
        """
        contract = self.plan.contract
        on_triton = [
            t for t in contract.targets if t.kind in (TargetKind.TRITON, TargetKind.OPENAI)
        ]
        groups = [(TargetKind.TRITON, on_triton)] if on_triton else []
        groups += [
            (TargetKind.VLLM_OPENAI, [t])
            for t in contract.targets
            if t.kind is TargetKind.VLLM_OPENAI
        ]
        logs = self.plan.run_dir / "logs"
        pending: list[tuple[Service, list[Target], float]] = []
        for kind, targets in groups:
            label = ", ".join(t.name for t in targets)
            try:
                service = service_for(kind, targets, logs, served=contract.model)
                self.step(f"starting {kind.value} for {label}")
                service.start()
            except (OSError, ValueError, RuntimeError) as error:
                for t in targets:
                    results[t.name] = self.failed(t, f"server did not start: {error}")
                continue
            pending.append((service, targets, time.monotonic()))
        services: dict[str, Service] = {}
        started: dict[str, float] = {}
        for service, targets, began in pending:
            label = ", ".join(t.name for t in targets)
            try:
                service.wait_ready()
            except (OSError, ValueError, RuntimeError, TimeoutError) as error:
                service.stop()
                self.say(f"[red]✗ {label}: server did not start[/]")
                for t in targets:
                    results[t.name] = self.failed(t, f"server did not start: {error}")
                continue
            # Servers start side by side; each one's time is until it answered ready.
            startup_s = time.monotonic() - began
            self.say(f"ready in {startup_s:.0f} s: {label}")
            if isinstance(service, TritonService):
                self.tritonserver = tritonserver_version(service.server.http_url)
            for t in targets:
                services[t.name], started[t.name] = service, startup_s
        return services, started

    def warm_up(self, service: Service, target: Target, startup_s: float) -> TargetResult:
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
                self.drive(
                    service, target, self.plan.warmup, self.plan.scratch / target.name / "warmup"
                )
            except ToolError as error:
                self.say(f"[red]✗ {target.name}: warm-up failed[/]")
                result.status, result.error = "failed", f"warm-up failed: {error}"
                self.step(target.name, advance=self.per_target_steps)
        return result

    def run_rounds(
        self, services: dict[str, Service], targets: list[Target], results: dict[str, TargetResult]
    ) -> None:
        """Level by level, ``rounds`` times, the targets' order rotated each round.

        In a request-rate sweep a target whose rate broke in every round is saturated:
        it is not driven at the higher rates, and the sweep ends when no target is left.
        """
        load_spec = self.plan.contract.load
        rounds = load_spec.rounds
        active = list(targets)
        for load in self.plan.levels:
            skipped = len(targets) - len(active)
            if skipped:  # saturated targets are not raised: their steps are done
                self.step(f"{load.level:g}: {skipped} saturated", advance=rounds * skipped)
            if not active:
                continue
            for round_ in range(rounds):
                for target in rotated(active, round_):
                    service, result = services[target.name], results[target.name]
                    self.measure_quietly(service, target, load, round_, result)
            if self.on_level_done is not None:
                self.on_level_done([results[t.name] for t in targets])
            if load_spec.sweep and load_spec.saturation_rule is not None:
                active = self.still_rising(active, load.level, results)

    def still_rising(
        self, active: list[Target], rate: float, results: dict[str, TargetResult]
    ) -> list[Target]:
        """The targets a sweep keeps raising: those whose ``rate`` did not break in every round."""
        rule = self.plan.contract.load.saturation_rule
        assert rule is not None
        rising = []
        for target in active:
            result = results[target.name]
            if saturation.rate_level(result, rate, rule).state == "broke":
                result.notes.append(
                    f"sweep stopped after {rate:g} req/s: no round held there (saturated)"
                )
                self.say(f"[yellow]{target.name} saturated at {rate:g} req/s: sweep stops[/]")
            else:
                rising.append(target)
        return rising

    def measure(
        self,
        service: Service,
        target: Target,
        load: LevelLoad,
        round_: int,
        result: TargetResult,
        attempt: int = 0,
    ) -> None:
        """One level of one target in one round, with the machine's noise around it.

        A retry (``attempt`` > 0) gets prompts of its own: the first attempt's are in the
        engine's prefix cache and would turn its prefill into a hit.
        """
        rounds = self.plan.contract.load.rounds
        where = f"{target.name} at {load.level:g}, round {round_ + 1}/{rounds}"
        self.step(where)
        before = server_metrics.parse(service.metrics_text() or "", target.model)
        retry = f"-retry-{attempt}" if attempt else ""
        artifacts = (
            self.plan.scratch / target.name / f"level-{load.level:g}" / f"round-{round_ + 1}{retry}"
        )
        load = self.plan.round_load(load, round_, target.name + retry)
        try:
            with RoundWatch(QUIET_WINDOW_S) as watch:
                records = self.drive(service, target, load, artifacts)
        except ToolError as error:
            result.failed_levels[f"{load.level:g} round {round_ + 1}"] = LevelFailure(
                error=error.reason, exit_code=error.exit_code, log_tail=error.log_tail
            )
            self.say(f"[red]✗ {where}[/]: {error.reason}")
            self.step(where, advance=1)
            return
        after = server_metrics.parse(service.metrics_text() or "", target.model)
        moved = server_metrics.delta(before, after)
        if moved:
            key = f"{load.level:g}"
            summed = result.server_metrics.setdefault(key, {})
            for name, value in moved.items():
                summed[name] = summed.get(name, 0.0) + value
        self.record(result, load.level, records, round_, watch.sample)
        self.step(where, advance=1)

    def measure_quietly(
        self, service: Service, target: Target, load: LevelLoad, round_: int, result: TargetResult
    ) -> None:
        """:meth:`measure`, again while other processes took too much CPU during it.

        Retried at most ``noisy_round_retries`` times, with prompts of its own; each noisy
        measurement moves to ``discarded_rounds`` (in results.json, in no figure). A
        round still noisy after its retries stays, and makes the run noisy. A round whose
        load tool failed is retried the same way; the failure becomes a note.
        """
        limits = self.plan.contract.load
        for attempt in range(limits.noisy_round_retries + 1):
            self.measure(service, target, load, round_, result, attempt)
            last = result.levels[-1] if result.levels else None
            if last is None or (last.level, last.round) != (load.level, round_):
                # The tool failed (its evidence is in failed_levels): once more, if allowed,
                # since a load tool's one-off failure should not cost a comparison a round.
                key = f"{load.level:g} round {round_ + 1}"
                if attempt == limits.noisy_round_retries or key not in result.failed_levels:
                    return
                failure = result.failed_levels.pop(key)
                result.notes.append(f"{key}: the tool failed ({failure.error}); measured again")
                self.say(f"[yellow]↻ {target.name} at {key}[/]: the tool failed; once more")
                continue
            share = last.noise.foreign_cpu_share_during if last.noise else 0.0
            if share <= limits.max_foreign_cpu_share or attempt == limits.noisy_round_retries:
                return
            result.discarded_rounds.append(result.levels.pop())
            self.say(
                f"[yellow]↻ {target.name} at {load.level:g} r{round_ + 1}[/]: other processes "
                f"took {share:.0%} of the CPU (limit {limits.max_foreign_cpu_share:.0%}); "
                "measuring the round again"
            )

    def drive(
        self, service: Service, target: Target, load: LevelLoad, artifacts: Path
    ) -> list[MeasuredRequest]:
        """One level (or the warm-up) with the target's tool; ToolError if it yields nothing."""
        contract = self.plan.contract
        warmup = load is self.plan.warmup
        # The warm-up is always a closed loop: it only has to reach every code path once.
        open_loop = contract.load.mode == "request_rate" and not warmup
        if target.tool == "perf_analyzer" and target.kind is not TargetKind.TRITON:
            return perf_analyzer_driver.run_openai_level(
                service.endpoint(target, contract.model, contract.sampling),
                load.requests,
                artifacts,
                concurrency=int(load.level),  # validation keeps it off request rates
                max_duration_s=contract.load.max_duration_s,
                exact_lengths=contract.sampling.ignore_eos,
            )
        if target.tool == "perf_analyzer":
            if not isinstance(service, TritonService):
                raise ToolError("perf_analyzer needs a Triton target")
            return perf_analyzer_driver.run_level(
                service.server.grpc_url,
                str(target.model),
                load.requests,
                contract.sampling,
                artifacts,
                concurrency=int(load.level),  # validation keeps it off request rates
                max_duration_s=contract.load.max_duration_s,
                chat=target.chat,
            )
        endpoint = service.endpoint(target, contract.model, contract.sampling)
        return aiperf_driver.run_level(
            endpoint,
            load.requests,
            load.trace,
            artifacts,
            tokenizer=self.plan.model_dir,
            mode="request_rate" if open_loop else "concurrency",
            level=load.level,
            max_duration_s=contract.load.max_duration_s,
            seed=contract.seed,
            exact_lengths=contract.sampling.ignore_eos,
        )

    def record(
        self,
        result: TargetResult,
        level: float,
        records: list[MeasuredRequest],
        round_: int = 0,
        noise: NoiseSample | None = None,
    ) -> None:
        metrics = summarize(level, records, self.plan.contract.slo)
        metrics.round, metrics.noise = round_, noise
        result.levels.append(metrics)
        colour = "green" if metrics.errors == metrics.short == 0 else "yellow"
        foreign = f", foreign CPU {noise.foreign_cpu_share_during:.0%}" if noise else ""
        self.say(
            f"[{colour}]✓ {result.name} at {level:g} r{round_ + 1}[/]: "
            f"{metrics.output_tok_s:.1f} tok/s, "
            f"TTFT p50 {metrics.ttft_ms.p50 or 0:.0f} ms p95 {metrics.ttft_ms.p95 or 0:.0f} ms, "
            f"TPOT p50 {metrics.tpot_ms.p50 or 0:.1f} ms, "
            f"errors {metrics.errors}, short {metrics.short} of {metrics.requests}{foreign}"
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
        self.step(target.name, advance=self.per_target_steps)
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
            interleaved=False,
            notes=[
                "ran alone after the servers stopped (its rounds back to back, not "
                "interleaved with the other targets): comparisons with it get no verdict; "
                "its noise figures cover the whole offline job"
            ],
        )
        if self.plan.contract.load.mode != "concurrency":
            result.status, result.error = "failed", "the offline ceiling needs concurrency levels"
            self.step(target.name, advance=self.per_target_steps)
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
        with RoundWatch(QUIET_WINDOW_S) as watch:
            code = self.run_offline_engine(job_path, out_path, log)
        if code == 0 and out_path.is_file():
            try:
                self.record_offline(result, json.loads(out_path.read_text()), watch.sample)
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
                {
                    "level": lv.level,
                    "round": r,
                    "workload": str(self.plan.round_load(lv, r, target.name).workload),
                }
                for r in range(contract.load.rounds)
                for lv in self.plan.levels
            ],
        }

    def run_offline_engine(self, job_path: Path, out_path: Path, log: Path) -> int | None:
        """Run the job in its own session; its exit code, or None if it outran its time."""
        load = self.plan.contract.load
        timeout = OFFLINE_STARTUP_ALLOWANCE_S + load.max_duration_s * (
            len(self.plan.levels) * load.rounds + 1
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

    def record_offline(
        self, result: TargetResult, data: dict, noise: NoiseSample | None = None
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
                self.record(result, level["level"], records, round_, noise)
            self.step(result.name, advance=1)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the runner's finally: servers stop


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """While a run lasts, SIGTERM unwinds it (servers stop) instead of killing it outright.

    Only where nobody handles SIGTERM yet: a host that does (the test session turns it
    into an interrupt) keeps its handler, which unwinds the run just the same. The
    previous disposition comes back when the run ends.
    """
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def write_results(
    plan: RunPlan,
    targets: list[TargetResult],
    environment: Environment,
    started: str,
    finished: str | None,
) -> RunResult:
    """results.json and report.md from the targets as they stand (a checkpoint if unfinished)."""
    from tritonforge.bench import report

    by_name = {t.name: t for t in targets}
    load = plan.contract.load
    noisiest = max(
        (
            (m.noise.foreign_cpu_share_during, f"{t.name} at {m.level:g} round {m.round + 1}")
            for t in targets
            if t.interleaved
            for m in t.levels
            if m.noise is not None
        ),
        default=None,
    )
    noisy = noisiest is not None and noisiest[0] > load.max_foreign_cpu_share
    comparisons = [
        row
        for spec in plan.contract.comparisons
        if spec.target in by_name and spec.baseline in by_name
        for row in compare(
            spec, by_name[spec.target], by_name[spec.baseline], load.levels, noisy=noisy
        )
    ]
    rule = load.saturation_rule
    saturation_points = (
        []
        if rule is None
        else [
            saturation.assess(t, rule, load.rounds, noisy=noisy)
            for t in targets
            if t.levels or t.failed_levels
        ]
    )
    try:
        shown_path = str(plan.contract_path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        shown_path = str(plan.contract_path)
    result = RunResult(
        contract_name=plan.contract.name,
        contract_path=shown_path,
        contract_sha256=plan.contract_sha256,
        overrides=plan.overrides,
        contract=plan.contract.model_dump(mode="json", by_alias=True),
        started_at=started,
        finished_at=finished or "not finished: checkpoint after the last completed level",
        load_mode=plan.contract.load.mode,
        environment=environment,
        targets=targets,
        comparisons=comparisons,
        rounds=load.rounds,
        max_foreign_cpu_share=load.max_foreign_cpu_share,
        noisy=noisy,
        saturation=saturation_points,
        noisiest_round=None
        if noisiest is None
        else f"{noisiest[1]}: {noisiest[0]:.1%} of the machine used by other processes",
    )
    (plan.run_dir / "results.json").write_text(result.model_dump_json(indent=2) + "\n")
    report.write(result, plan.run_dir)
    return result


def run_contract(
    contract_path: Path,
    overrides: Sequence[str] = (),
    results_root: Path = RESULTS_ROOT,
    console: Console | None = None,
    allow_served_mismatch: bool = False,
) -> Path:
    """Run everything a contract names; return the run directory (results.json, report.md).

    After every level (all its rounds) the results so far are written as a checkpoint,
    so a run stopped part-way still leaves what it measured, marked as not finished.
    Launched from a tree other than the one the serving venv imports ``tritonforge``
    from, it refuses to start (:class:`ServedCodeMismatch`) unless
    ``allow_served_mismatch``, which labels the results.
    """
    console = console or Console(stderr=True, soft_wrap=True)
    code = served_code(allow_mismatch=allow_served_mismatch)
    # A run stopped with SIGTERM (or started in the background, where SIGINT is ignored)
    # must still stop its servers: they run in sessions of their own and would outlive it.
    with _sigterm_unwinds():
        return _run(contract_path, overrides, results_root, console, code)


def _run(
    contract_path: Path,
    overrides: Sequence[str],
    results_root: Path,
    console: Console,
    code: ServedCode,
) -> Path:
    """:func:`run_contract`'s body, run while SIGTERM unwinds it."""
    plan = prepare(contract_path, overrides, results_root, console)
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    environment = capture(plan.model_dir, code)
    if code.launched_from is not None:
        console.print(f"[yellow]{describe_code(environment)}[/]")
    runner = Runner(plan, console)

    def checkpoint(targets: list[TargetResult]) -> None:
        environment.tritonserver = runner.tritonserver
        write_results(plan, targets, environment, started, None)

    runner.on_level_done = checkpoint
    try:
        targets = runner.run()
    except (SystemExit, KeyboardInterrupt):
        # Stopped part-way: keep every round measured so far, the unfinished level too.
        checkpoint(list(runner.results.values()))
        raise
    environment.tritonserver = runner.tritonserver
    finished = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    write_results(plan, targets, environment, started, finished)
    console.print(
        f"results: {plan.run_dir / 'results.json'}\nreport:  {plan.run_dir / 'report.md'}"
    )
    return plan.run_dir
