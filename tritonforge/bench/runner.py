"""Run a contract end to end: build the load, start each target, measure, stop, report.

This module schedules the rounds and measures them; around it, :mod:`.run_plan` fixes
the workload before anything starts, :mod:`.lifecycle` starts and stops the servers,
:mod:`.offline_ceiling` runs the engine without a server, and :mod:`.output` writes
results.json and report.md (after every level, and at the end).

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
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from tritonforge.bench import aiperf_driver, perf_analyzer_driver, saturation, server_metrics
from tritonforge.bench.contract import Target, TargetKind
from tritonforge.bench.environment import (
    ServedCode,
    capture,
    describe_code,
    served_code,
)
from tritonforge.bench.lifecycle import start_servers
from tritonforge.bench.metrics import MeasuredRequest, summarize
from tritonforge.bench.noise import QUIET_WINDOW_S, NoiseSample, RoundWatch, is_noisy
from tritonforge.bench.offline_ceiling import OfflineCeiling
from tritonforge.bench.output import write_results
from tritonforge.bench.results import LevelFailure, TargetResult
from tritonforge.bench.run_plan import LevelLoad, RunPlan, prepare, rotated
from tritonforge.bench.services import Service, TritonService
from tritonforge.bench.tools import ToolError
from tritonforge.paths import REPO_ROOT

RESULTS_ROOT = REPO_ROOT / "perf" / "results"


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
            servers = start_servers(self, results)
            self.tritonserver = servers.tritonserver
            try:
                live = [t for t in contract.targets if t.name in servers.services]
                for target in live:
                    results[target.name] = self.warm_up(
                        servers.services[target.name], target, servers.startup_s[target.name]
                    )
                self.run_rounds(
                    servers.services, [t for t in live if results[t.name].status == "ok"], results
                )
            finally:
                self.step("stopping the servers")
                servers.stop()
            for target in contract.targets:
                if target.kind is TargetKind.VLLM_OFFLINE:
                    results[target.name] = self.run_offline(target)
        return [self.settle(results[t.name]) for t in contract.targets]

    def warm_up(self, service: Service, target: Target, startup_s: float) -> TargetResult:
        result = TargetResult.of(
            target, "ok", startup_s=startup_s, load_average_1m=os.getloadavg()[0]
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
            noisy = is_noisy(share, limits.max_foreign_cpu_share)
            if not noisy or attempt == limits.noisy_round_retries:
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
        return TargetResult.of(target, "failed", error=error)

    def run_offline(self, target: Target) -> TargetResult:
        """vLLM's engine without a server over every level, alone: the ceiling."""
        return OfflineCeiling(self).run(target)


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
