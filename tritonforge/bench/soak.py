"""``make soak``: the reliability suite at full size, on a server of its own.

    .venv/bin/python -m tritonforge.bench soak --minutes 5 --concurrency 64

One tritonserver (the chosen models and the steps their ensembles need) runs the four
scenarios of :mod:`tritonforge.bench.reliability` in order — mixed load, cancellation
storm, malformed-request storm, then SIGTERM under load, which ends that server — and
the run writes ``perf/results/reliability/<UTC time>/results.json`` (every figure and
verdict, versions, machine with its ISA flags, the exact settings) and ``report.md``.
The engine-kill scenario is ``tests/e2e/test_engine_restart.py`` (it needs its own
server and runs in ``make test``); the report points to it.

The machine's load is recorded with the figures: on the 2-core machines here another
tritonserver running beside the soak shows up in its latencies (not in its verdicts),
and a committed run should come from a quiet machine.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil
from pydantic import BaseModel
from rich.console import Console

from tritonforge.bench.environment import (
    Environment,
    capture,
    describe_code,
    describe_machine,
    served_code,
    tritonserver_version,
)
from tritonforge.bench.reliability.cancel_storm import cancel_storm
from tritonforge.bench.reliability.mixed_load import mixed_load
from tritonforge.bench.reliability.models import LLM, models_to_load
from tritonforge.bench.reliability.sigterm import sigterm_under_load
from tritonforge.bench.reliability.verdict import Scenario
from tritonforge.launch.launcher import REPO_ROOT, TritonServer
from tritonforge.paths import new_run_dir

RESULTS_ROOT = REPO_ROOT / "perf" / "results" / "reliability"
ENGINE_KILL = "tests/e2e/test_engine_restart.py"


class SoakSettings(BaseModel):
    minutes: float
    warmup_minutes: float
    concurrency: int
    models: list[str]
    engine_model: str = LLM  # among the models: its engine gauges are read, it takes chat
    cancel_streams: int
    malformed_examples: int
    sigterm_requests: int
    seed: int
    command: str


class SoakResult(BaseModel):
    started_utc: str
    passed: bool
    settings: SoakSettings
    environment: Environment
    load_average_at_start: tuple[float, float, float]
    load_average_at_end: tuple[float, float, float]
    other_tritonservers_at_start: list[str]
    scenarios: list[Scenario]
    engine_kill: str
    server_log: str


def other_tritonservers() -> list[str]:
    """Command lines of tritonserver processes already running (another user's load)."""
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if proc.info.get("name") == "tritonserver" or (
            cmdline and cmdline[0].endswith("/tritonserver")
        ):
            found.append(f"{proc.pid} {' '.join(cmdline)[:160]}")
    return found


def run(
    settings: SoakSettings, results_root: Path = RESULTS_ROOT, allow_served_mismatch: bool = False
) -> tuple[Path, SoakResult]:
    """Start the server, run the four scenarios, write results.json and report.md."""
    from tritonforge.launch.model_store import ensure_default_model

    console = Console(stderr=True)
    code = served_code(allow_mismatch=allow_served_mismatch)  # refused before anything starts
    out = new_run_dir(results_root)
    stamp = out.name
    env = capture(ensure_default_model(quiet=True), code)
    load_start = os.getloadavg()
    others = other_tritonservers()
    if others:
        console.print(f"[yellow]note: {len(others)} other tritonserver(s) running[/]")
    log = Path(tempfile.gettempdir()) / f"tritonforge-soak-{stamp}.log"
    server = TritonServer.on_free_ports(models=models_to_load(settings.models), log_path=log)
    console.print(f"soak: starting tritonserver ({', '.join(settings.models)}); log {log}")
    server.start()
    try:
        server.wait_ready()
        env.tritonserver = tritonserver_version(server.http_url)
        scenarios = run_scenarios(server, settings, console)
    finally:
        server.stop()
    result = SoakResult(
        started_utc=stamp,
        passed=len(scenarios) == 4 and all(s.passed for s in scenarios),
        settings=settings,
        environment=env,
        load_average_at_start=load_start,
        load_average_at_end=os.getloadavg(),
        other_tritonservers_at_start=others,
        scenarios=scenarios,
        engine_kill=f"{ENGINE_KILL} (make test): SIGKILL of vLLM's engine core under load",
        server_log=str(log),
    )
    (out / "results.json").write_text(result.model_dump_json(indent=2) + "\n")
    (out / "report.md").write_text(report(result))
    return out, result


def run_scenarios(server: TritonServer, s: SoakSettings, console: Console) -> list[Scenario]:
    """The four scenarios in order on a ready server; the last one ends it."""
    from tritonforge.bench.reliability.malformed import malformed_storm

    def mixed() -> Scenario:
        return asyncio.run(
            mixed_load(
                server,
                models=s.models,
                concurrency=s.concurrency,
                duration_s=s.minutes * 60,
                warmup_s=s.warmup_minutes * 60,
                processes=server.group_processes,
                seed=s.seed,
                progress=lambda line: console.print(f"  {line}"),
                chat_models=(s.engine_model,),
            )
        )

    steps: list[tuple[str, Callable[[], Scenario]]] = [
        (f"mixed load, {s.minutes:g} min at {s.concurrency}", mixed),
        (
            f"{s.cancel_streams} streams cancelled at once",
            lambda: asyncio.run(
                cancel_storm(server, streams=s.cancel_streams, model=s.engine_model)
            ),
        ),
        (
            f"{s.malformed_examples} malformed requests",
            lambda: malformed_storm(
                server, s.malformed_examples, models=s.models, chat_model=s.engine_model
            ),
        ),
        (
            f"SIGTERM with {s.sigterm_requests} requests in flight",
            lambda: asyncio.run(
                sigterm_under_load(
                    server,
                    models=s.models,
                    requests=s.sigterm_requests,
                    engine_model=s.engine_model,
                )
            ),
        ),
    ]
    scenarios = []
    for what, scenario in steps:
        console.print(f"soak: {what}")
        scenarios.append(scenario())
        _show(console, scenarios[-1])
    return scenarios


def _show(console: Console, scenario: Scenario) -> None:
    verdict = "[green]PASS[/]" if scenario.passed else "[red]FAIL[/]"
    console.print(f"  {verdict} {scenario.name} ({scenario.seconds:.0f} s)")
    for failure in scenario.failures[:5]:
        console.print(f"    {failure}")


def _gib(value: Any) -> str:
    return f"{value / 2**30:.2f} GiB" if isinstance(value, int | float) else "–"


def _headline(scenario: Scenario) -> str:
    """The figures that decide a scenario's verdict, in one line."""
    f = scenario.figures
    if scenario.name == "mixed_load":
        line = (
            f"{f['succeeded']} of {f['requests']} requests succeeded, {f['failed']} failed "
            f"({f['hung']} hung), {f['requests_per_s']} req/s, latency p50 "
            f"{f['latency_s_p50']} s / p99 {f['latency_s_p99']} s"
        )
        if "rss_growth_pct" in f:
            line += (
                f"; server RSS {_gib(f['rss_after_warmup_bytes'])} after warm-up → "
                f"{_gib(f['rss_at_end_bytes'])} at the end ({f['rss_growth_pct']:+.2f} %, "
                f"{f['server_processes']} processes)"
            )
        return line
    if scenario.name == "cancel_storm":
        return (
            f"{f['streams']} streams ({f['running_at_cancel']:.0f} running + "
            f"{f['waiting_at_cancel']:.0f} waiting, {f['streams_with_output_at_cancel']} "
            f"streaming) cancelled → running/waiting 0 after {f['idle_after_cancel_s']} s; KV "
            f"{f['kv_usage_at_cancel']:.3f} → {f['kv_usage_after']:.3f} (baseline "
            f"{f['kv_usage_baseline']:.3f}) after {f['kv_back_after_s']} s; "
            f"{f['counted_cancelled']:.0f} counted cancelled"
        )
    if scenario.name == "malformed_storm":
        return (
            f"{f['refused_by_name']} of {f['sent']} refused naming the field "
            f"({f['over_http']} HTTP, statuses {', '.join(f['http_statuses'])}; "
            f"{f['over_grpc']} gRPC; {f['faults']} kinds of fault); greedy answer "
            f"{'unchanged' if f['greedy_unchanged'] else 'CHANGED'}"
        )
    if scenario.name == "sigterm_under_load":
        exited = (
            f"exited after {f['server_exited_after_s']} s (code {f['server_exit_code']})"
            if f["server_exit_code"] is not None
            else "had not exited"
        )
        return (
            f"{f['in_engine_at_sigterm']:.0f} in the engine at SIGTERM: {f['answered']} "
            f"answered, {f['errored']} ended with an error (first {f['first_end_after_sigterm_s']}"
            f" s, last {f['last_end_after_sigterm_s']} s after the signal), {f['hung']} hung; "
            f"tritonserver {exited}; {len(f['processes_left'])} processes of its group left"
        )
    return ""


def report(result: SoakResult) -> str:
    """report.md: verdicts and headline figures; results.json has everything."""
    s, env = result.settings, result.environment
    lines = [
        f"# Reliability soak {result.started_utc}: {'PASS' if result.passed else 'FAIL'}",
        "",
        f"Command: `{s.command}` — {s.minutes:g} min of mixed load at concurrency "
        f"{s.concurrency} over {', '.join(s.models)} (warm-up {s.warmup_minutes:g} min), "
        f"{s.cancel_streams} streams cancelled at once, {s.malformed_examples} malformed "
        f"requests, SIGTERM with {s.sigterm_requests} requests in flight; seed {s.seed}.",
        "",
        "| scenario | verdict | figures |",
        "|---|---|---|",
    ]
    for scenario in result.scenarios:
        verdict = "pass" if scenario.passed else "**fail**"
        lines.append(f"| {scenario.name} | {verdict} | {_headline(scenario)} |")
    lines += [
        f"| engine kill | see `{ENGINE_KILL}` | runs in `make test` on a server of its own |",
        "",
    ]
    for scenario in result.scenarios:
        lines.append(f"**{scenario.name}** ({scenario.seconds:.0f} s) — criteria: ")
        lines += [f"- {c}" for c in scenario.criteria]
        lines += [f"- failure: {f}" for f in scenario.failures]
        if scenario.figures.get("server_log_after_sigterm"):
            lines += ["", "Server log from the SIGTERM on:", "", "```"]
            lines += scenario.figures["server_log_after_sigterm"]
            lines.append("```")
        lines.append("")
    lines += [
        f"Machine: {describe_machine(env.machine)}.",
        "",
        f"Load average at start {_load(result.load_average_at_start)}, at end "
        f"{_load(result.load_average_at_end)}; other tritonservers at start: "
        f"{len(result.other_tritonservers_at_start)}.",
        "",
        f"Versions: {env.tritonserver}, "
        + ", ".join(f"{k} {v}" for k, v in env.serving_versions.items())
        + f"; model {env.model.name} sha256 {env.model.sha256[:12]}; {describe_code(env)}",
        "",
    ]
    return "\n".join(lines)


def _load(values: Sequence[float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def main(args: Any) -> int:
    """The ``soak`` subcommand of ``python -m tritonforge.bench``."""
    settings = SoakSettings(
        minutes=args.minutes,
        warmup_minutes=args.warmup_minutes
        if args.warmup_minutes is not None
        else min(1.0, args.minutes / 4),
        concurrency=args.concurrency,
        models=args.models,
        engine_model=args.engine_model,
        cancel_streams=args.cancel_streams,
        malformed_examples=args.malformed_examples,
        sigterm_requests=args.sigterm_requests or args.concurrency,
        seed=args.seed,
        command=shlex.join([Path(sys.executable).name, "-m", "tritonforge.bench", *sys.argv[1:]]),
    )
    out, result = run(
        settings,
        Path(args.results) if args.results else RESULTS_ROOT,
        allow_served_mismatch=args.allow_served_mismatch,
    )
    print(out)
    return 0 if result.passed else 1
