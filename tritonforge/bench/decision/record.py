"""``decide``: a contract run, operability and exit-cost results → a decision record.

    python -m tritonforge.bench decide --track cpu --run perf/results/chat-mix/<UTC> \\
        --operability perf/results/operability/<UTC>/operability.json \\
        --exit-cost perf/results/exit-cost/<UTC> --out perf/decisions/chat-mix-cpu.md

The record is Markdown written only from those files (as ``report.md`` is from
``results.json``), so it can be rebuilt and never shows a number no result holds. One
record per hardware track: CPU and GPU candidates never share a ranking, and a track
whose candidates could not run here says so instead of choosing. The verdicts are the
bench's own (:func:`tritonforge.bench.results.judge`); the choice is
:mod:`tritonforge.bench.decision.choice`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tritonforge.bench import report
from tritonforge.bench.contract import load_contract
from tritonforge.bench.decision import choice as choosing
from tritonforge.bench.decision.operability import Candidate, OperabilityFile, load
from tritonforge.bench.environment import describe_code, describe_machine
from tritonforge.bench.exit_cost import changes
from tritonforge.bench.exit_cost.results import SuiteResult, load_dir
from tritonforge.bench.results import RunResult, TargetResult, spread_text
from tritonforge.paths import REPO_ROOT


def _fmt(value: float | None, digits: int = 0, unit: str = "") -> str:
    return "–" if value is None else f"{value:,.{digits}f}{unit}"


def _yes(value: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "–"}[value]


def workload(result: RunResult, notes: list[str]) -> list[str]:
    """The contract's SLO, load and traffic as its report says them, and what was reduced."""
    summary = report._contract_summary(result)[2:]
    reduced = (
        ["The overrides above are how this run reduced the contract (to fit the window it had)."]
        if result.overrides
        else []
    )
    env = result.environment
    return [
        "## Workload and SLO",
        "",
        *summary,
        *reduced,
        *[f"{n}" for n in notes],
        "",
        f"Machine: {describe_machine(env.machine)}; code: {describe_code(env)}; model "
        f"`{env.model.name}` sha256 `{env.model.sha256[:16]}…`.",
        "",
    ]


def contract_workload(path: Path) -> list[str]:
    """A track with no run: the workload and SLO it is to be decided on, from the contract."""
    contract, digest = load_contract(path)
    slo, load = contract.slo, contract.load
    return [
        "## Workload and SLO",
        "",
        f"Contract `{_shown(path)}` (sha256 `{digest[:12]}`), not run on this track. SLO: "
        f"TTFT p95 ≤ {slo.ttft_p95_ms:g} ms, TPOT p95 ≤ {slo.tpot_p95_ms:g} ms, errors ≤ "
        f"{slo.error_budget:.1%}. Load: {load.mode} {', '.join(f'{v:g}' for v in load.levels)}.",
        "",
        "Traffic: " + "; ".join(f"{c.name} {c.share:.0%}" for c in contract.traffic.classes),
        "",
    ]


def goodput(result: RunResult) -> list[str]:
    """Goodput within SLO per candidate and load, the SLO verdict per level, the decided
    wins between candidates and the contract's own comparisons."""
    unit = "concurrency" if result.load_mode == "concurrency" else "req/s offered"
    lines = [
        "## Goodput within SLO",
        "",
        *(["**The run was noisy: no verdict below is decided.**", ""] if result.noisy else []),
        f"Median over {result.rounds} interleaved round(s), min–max in brackets. SLO "
        "verdict per level: *met* when every round held the SLO, *missed* when none did, "
        "*inconclusive* when the rounds disagree.",
        "",
        f"| candidate | {unit} | goodput req/s | TTFT p95 ms | TPOT p95 ms | errors "
        "| SLO verdict |",
        "|---|---:|---|---|---|---:|---|",
    ]
    for target in result.targets:
        if not target.levels:
            lines.append(f"| {target.name} | – | {target.status}: {target.error or '–'} ||||")
            continue
        lines += [_goodput_row(result, target, lv) for lv in target.measured_levels()]
    if result.comparisons:
        lines += [
            "",
            "The contract's comparisons:",
            "",
            *report._comparison_table(result.comparisons),
        ]
    return [*lines, ""]


def _goodput_row(result: RunResult, target: TargetResult, level: float) -> str:
    """One candidate at one load: goodput, tails, errors and the SLO verdict."""
    rounds = list(target.rounds_at(level).values())
    errors = sum(m.errors + m.short for m in rounds)
    verdict = choosing.slo_verdict(result, target, level)
    return (
        f"| {target.name} | {level:g} | {spread_text([m.goodput_rps for m in rounds], 2)} "
        f"| {spread_text([m.ttft_ms.p95 for m in rounds], 0)} "
        f"| {spread_text([m.tpot_ms.p95 for m in rounds], 1)} "
        f"| {errors} | {report._verdict(verdict)} |"
    )


def overload(paths: list[Path]) -> list[str]:
    """Overload and peer runs' verdicts as their own reports wrote them (verdicts.json)."""
    if not paths:
        return []
    lines = ["## Past saturation", ""]
    for path in paths:
        data = json.loads((path / "verdicts.json").read_text())
        quiet = "quiet" if data.get("machine_quiet") else "**not quiet**"
        lines += [f"`{_shown(path)}` (machine {quiet}):", "", "| target | per round | verdict |"]
        lines.append("|---|---|---|")
        for row in data["targets"]:
            per_round = ", ".join(str(v) for v in row["per_round"]) or "—"
            lines.append(f"| {row['target']} | {per_round} | **{row['verdict']}** |")
        lines.append("")
    return lines


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def operability_table(candidates: list[Candidate]) -> list[str]:
    """Install, SIGTERM, an engine killed, observability and pins, per candidate."""
    lines = [
        "## Operability",
        "",
        "| candidate | runtime | install cold / warm s, disk | SIGTERM with requests in "
        "flight | engine killed under load | metrics show queue / KV / scheduler / worker "
        "| one request followed by id | pinned by |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in candidates:
        if c.status != "measured":
            lines.append(f"| {c.candidate} | {c.runtime} | {c.status}: {c.reason} ||||||")
            continue
        install = "–"
        if c.install is not None:
            disk = c.install.disk_bytes
            install = (
                f"{_fmt(c.install.cold_s)} / {_fmt(c.install.warm_s)}, "
                f"{_fmt(disk / 2**30 if disk is not None else None, 1, ' GiB')}"
            )
        shutdown = "–"
        if (s := c.shutdown) is not None:
            shutdown = (
                f"{s.completed} of {s.in_flight} completed, {s.failed} failed"
                + (
                    f" ({', '.join(f'{k} {v}' for k, v in s.failures.items())})"
                    if s.failures
                    else ""
                )
                + f"; exit {_fmt(s.exit_s, 1, ' s') if s.exit_s is not None else 'not by itself'}"
            )
        failure = "–"
        if (f := c.failure) is not None:
            back = (
                f"served again in {_fmt(f.recovery_s, 0, ' s')}"
                if f.recovered
                else ("**not served again by itself**" if f.recovered is False else "recovery –")
            )
            failure = (
                f"{f.killed}: of {f.in_flight}, {f.completed} completed, {f.errors} errors, "
                f"{f.hung} hung; {back}"
            )
        o = c.observability
        seen = (
            " / ".join(_yes(getattr(o, p)) for p in ("queue", "kv_cache", "scheduler", "worker"))
            if o
            else "–"
        )
        pins = ", ".join(f"`{p}`" for p in c.upgrade.pins) if c.upgrade else "–"
        lines.append(
            f"| {c.candidate} | {c.runtime} | {install} | {shutdown} | {failure} | {seen} "
            f"| {_yes(o.request_id) if o else '–'} | {pins} |"
        )
    return [*lines, ""]


def exit_cost_section(suites: list[SuiteResult], chosen: str | None) -> list[str]:
    """The checks per candidate, the change counts, and the moves to and from the choice."""
    if not suites:
        return ["## Exit cost", "", "Not measured for this record.", ""]
    lines = ["## Exit cost", "", *changes.status_table(suites), "", *changes.count_matrix(suites)]
    mine = next((s for s in suites if chosen in s.target_names()), None) if chosen else None
    if mine is not None:
        lines += ["", f"Leaving {mine.candidate} for each other candidate costs:", ""]
        for other in suites:
            if other is mine:
                continue
            found = changes.changes(mine, other)
            lines.append(
                f"- to **{other.candidate}**: " + ("; ".join(t for _, t in found) or "nothing")
            )
    return [*lines, ""]


def head_to_head_table(result: RunResult, decision: choosing.Decision) -> list[str]:
    """The choice against each other candidate at each load: per-round goodput ratios and
    the verdict (the choice ahead in every round: met)."""
    chosen = result.target(decision.choice) if decision.choice else None
    if chosen is None:
        return []
    others = [result.target(n) for n in decision.front + list(decision.lost)]
    lines = [
        f"{chosen.name}'s goodput within SLO over each other's, per paired round:",
        "",
        "| against | load | per round | verdict |",
        "|---|---:|---|---|",
    ]
    for other in others:
        if other is None or other is chosen or not other.levels or not other.interleaved:
            continue
        for level in sorted(set(chosen.measured_levels()) & set(other.measured_levels())):
            beat = choosing.head_to_head(result, chosen, other, level)
            per_round = ", ".join(f"{r:.2f}" for r in beat.ratios) or "–"
            lines.append(
                f"| {other.name} | {level:g} | {per_round} | {report._verdict(beat.verdict)} |"
            )
    return [*lines, ""]


def decision_section(decision: choosing.Decision, result: RunResult | None) -> list[str]:
    lines = ["## Choice", ""]
    if decision.choice is None:
        lines += [f"No choice on the {decision.track} track: {decision.why}.", ""]
    else:
        lines += [f"**{decision.choice}** — {decision.why}.", ""]
    if decision.lost:
        lines += ["Why each other candidate lost:" if decision.choice else "Per candidate:", ""]
        lines += [f"- **{name}**: " + " ".join(why) for name, why in decision.lost.items()]
        lines.append("")
    return [*lines, *(head_to_head_table(result, decision) if result else [])]


def cost_section(
    decision: choosing.Decision, candidates: list[Candidate], suites: list[SuiteResult]
) -> list[str]:
    """What running the choice costs, from its own measurements."""
    if decision.choice is None:
        return []
    op = choosing.operability_of(decision.choice, candidates)
    suite = choosing.exit_cost_of(decision.choice, suites)
    lines = ["## Operating cost accepted", ""]
    if op is None:
        lines.append("- operability: not measured for this candidate")
    else:
        lines += [f"- {fault}" for fault in op.faults()] or ["- no operability fault measured"]
        if op.install is not None:
            lines.append(
                f"- install: {_fmt(op.install.cold_s)} s cold, {_fmt(op.install.warm_s)} s warm"
            )
    faults = choosing.exit_faults(suite)
    lines.append(
        "- application contract: " + (", ".join(faults) if faults else "every check run passed")
        if suite
        else "- application contract: not measured for this candidate"
    )
    return [*lines, ""]


def rollback_section(decision: choosing.Decision, candidates: list[Candidate]) -> list[str]:
    if decision.choice is None:
        return []
    op = choosing.operability_of(decision.choice, candidates)
    if op is None or op.upgrade is None:
        return ["## Rollback", "", "Not recorded for this candidate.", ""]
    lines = ["## Rollback", "", "Pinned by: " + ", ".join(f"`{p}`" for p in op.upgrade.pins), ""]
    lines += [f"{i}. {step}" for i, step in enumerate(op.upgrade.rollback, 1)]
    return [*lines, ""]


def triggers(result: RunResult | None) -> list[str]:
    """When this record stops holding: what it was decided on, and the thresholds."""
    lines = ["## Re-evaluate when", ""]
    if result is None:
        return [*lines, "- a machine of this track is available to measure on", ""]
    env, c = result.environment, result.contract
    slo = c["slo"]
    versions = ", ".join(f"{k} {v}" for k, v in env.serving_versions.items()) or "–"
    shares = ", ".join(f"{k['name']} {k['share']:.0%}" for k in c["traffic"]["classes"])
    lines += [
        f"- the model or its quantization changes (decided on `{env.model.name}`, sha256 "
        f"`{env.model.sha256[:16]}…`, and the engines' own formats in the run);",
        f"- the hardware or its driver changes (decided on {describe_machine(env.machine)});",
        f"- a framework's major release (decided on {versions}; the candidates' servers as "
        "their exit-cost and operability files record);",
        f"- the traffic mix drifts: any class's share moves by 10 points or more from "
        f"{shares}, or the shared-prefix share from "
        f"{c['traffic']['shared_prefix']['share']:.0%};",
        f"- the SLO is violated in service: TTFT p95 > {slo['ttft_p95_ms']:g} ms, TPOT p95 > "
        f"{slo['tpot_p95_ms']:g} ms, or errors above {slo['error_budget']:.1%} — or the SLO "
        "itself changes.",
        "",
    ]
    return lines


def render(
    track: str,
    result: RunResult | None,
    candidates: list[Candidate],
    suites: list[SuiteResult],
    overload_dirs: list[Path],
    notes: list[str],
    sources: list[str],
    only: list[str] | None = None,
    contract: Path | None = None,
) -> str:
    if result is not None:
        decision = choosing.decide(result, track, candidates, suites, only)
        title = result.contract_name
        in_run = {t.name for t in result.targets}
        decision.lost |= {
            c.candidate: [f"{c.status}: {c.reason}"]
            for c in candidates
            if c.status != "measured" and not in_run & set(c.target_names())
        }
    else:
        decision = choosing.Decision(
            track, None, "no candidate of this track was measured on this machine", []
        )
        decision.lost = {c.candidate: [f"{c.status}: {c.reason}"] for c in candidates}
        title = load_contract(contract)[0].name if contract else "no run"
    lines = [
        f"# Decision record: `{title}`, {track.upper()} track",
        "",
        "Written by `python -m tritonforge.bench decide` from the results below; CPU and "
        "GPU candidates are decided in separate records, never ranked together.",
        "",
        "Sources: " + ", ".join(f"`{s}`" for s in sources),
        "",
    ]
    if result is not None:
        lines += workload(result, notes) + goodput(result)
    else:
        lines += contract_workload(contract) if contract else []
        lines += [*notes, ""] if notes else []
    lines += overload(overload_dirs)
    lines += (
        operability_table(candidates) if candidates else ["## Operability", "", "Not measured.", ""]
    )
    lines += exit_cost_section(suites, decision.choice)
    lines += decision_section(decision, result)
    lines += cost_section(decision, candidates, suites)
    lines += rollback_section(decision, candidates)
    lines += triggers(result)
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    result = (
        RunResult.model_validate_json((args.run / "results.json").read_text()) if args.run else None
    )
    files: list[OperabilityFile] = [load(p) for p in args.operability]
    candidates = [c for f in files if f.track == args.track for c in f.candidates]
    suites = [s for d in args.exit_cost for s in load_dir(d)]
    sources = [_shown(p) for p in [*([args.run] if args.run else []), *args.operability]]
    sources += [_shown(p) for p in [*args.exit_cost, *args.overload]]
    text = render(
        args.track,
        result,
        candidates,
        suites,
        args.overload,
        args.note,
        sources,
        args.candidate,
        args.contract,
    )
    name = result.contract_name if result else (args.contract.stem if args.contract else "none")
    out = (
        Path(args.out) if args.out else REPO_ROOT / "perf" / "decisions" / f"{name}-{args.track}.md"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    print(out)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--track", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--run", type=Path, help="a contract run's directory (its results.json)")
    p.add_argument(
        "--operability",
        type=Path,
        action="append",
        default=[],
        help="operability.json (repeatable)",
    )
    p.add_argument(
        "--exit-cost", type=Path, action="append", default=[], help="an exit-cost run directory"
    )
    p.add_argument(
        "--overload",
        type=Path,
        action="append",
        default=[],
        help="an overload or peers run directory with verdicts.json (repeatable)",
    )
    p.add_argument(
        "--contract", type=Path, help="without --run: the contract the track is to be decided on"
    )
    p.add_argument(
        "--candidate",
        action="append",
        help="a run's target to decide among (repeatable; default every target)",
    )
    p.add_argument("--note", action="append", default=[], help="a line for the workload section")
    p.add_argument("--out", help="default perf/decisions/<contract>-<track>.md")
