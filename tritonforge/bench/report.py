"""``report.md`` and its PNG plots, written from a :class:`RunResult` alone.

The report is generated only from results.json's model, so a report can be rebuilt
from an old run (``python -m tritonforge.bench report DIR``) and never shows a number
that is not in the results file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tritonforge.bench.contract import Load
from tritonforge.bench.environment import Environment, describe_code, describe_machine
from tritonforge.bench.metrics import LevelMetrics
from tritonforge.bench.results import (
    ComparisonResult,
    RunResult,
    SaturationResult,
    Spread,
    TargetResult,
    spread,
)
from tritonforge.bench.server_metrics import per_request_ms

PLOTS = (
    ("throughput.png", "Output tokens/s", lambda m: m.output_tok_s, None),
    ("ttft_p95.png", "TTFT p95 (ms)", lambda m: m.ttft_ms.p95, "ttft_p95_ms"),
    ("goodput.png", "Goodput (requests/s within SLO)", lambda m: m.goodput_rps, None),
)


def _fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _verdict(verdict: str | None) -> str:
    """A verdict as the report shows it; only *missed* is bold, n/a when no threshold."""
    if verdict is None:
        return "n/a"
    return {"missed": "**missed**", "noisy": "no verdict (noisy)"}.get(verdict, verdict)


def _spread(value: Spread | None, digits: int = 1) -> str:
    """median (min-max over the rounds); just the value when there was one round."""
    return "–" if value is None else value.text(digits)


def plot(result: RunResult, out_dir: Path) -> list[Path]:
    """One PNG per metric, one line per target; SLO drawn where the metric has one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xlabel = "concurrency" if result.load_mode == "concurrency" else "request rate (req/s)"
    paths = []
    for filename, title, value, slo_key in PLOTS:
        fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
        for target in result.targets:
            spreads = [(lv, spread(target, lv, value)) for lv in target.measured_levels()]
            points = [(lv, sp) for lv, sp in spreads if sp is not None]
            if points:
                xs = [lv for lv, _ in points]
                ys = [sp.median for _, sp in points]
                low = [sp.median - sp.min for _, sp in points]
                high = [sp.max - sp.median for _, sp in points]
                ax.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=3, label=target.name)
        if slo_key:
            bound = result.contract["slo"][slo_key]
            ax.axhline(bound, color="grey", linestyle="--", linewidth=1, label=f"SLO {bound:g} ms")
        levels = sorted({m.level for t in result.targets for m in t.levels})
        if len(levels) > 2 and levels[-1] / max(levels[0], 1e-9) >= 8:
            ax.set_xscale("log", base=2)
        if levels:
            ax.set_xticks(levels, [f"{lv:g}" for lv in levels])
        ax.set_xlabel(f"{xlabel} (median of rounds, bars: min–max)")
        ax.set_title(f"{title} — {result.contract_name}")
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
        fig.tight_layout()
        path = out_dir / filename
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    if result.saturation:
        paths.append(plot_capacity(result, out_dir))
    return paths


def plot_capacity(result: RunResult, out_dir: Path) -> Path:
    """Goodput (and achieved rate) against the nominal offered rate, one colour per target."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    top = max((lv.rate for s in result.saturation for lv in s.levels), default=1.0)
    ax.plot([0, top], [0, top], color="grey", linestyle=":", linewidth=1, label="offered")
    for sat in result.saturation:
        points = [(lv.rate, lv.goodput_rps) for lv in sat.levels if lv.goodput_rps is not None]
        if not points:
            continue
        xs = [rate for rate, _ in points]
        ys = [sp.median for _, sp in points]
        bars = [[sp.median - sp.min for _, sp in points], [sp.max - sp.median for _, sp in points]]
        line = ax.errorbar(xs, ys, yerr=bars, marker="o", capsize=3, label=f"{sat.target} goodput")
        achieved = [(lv.rate, lv.achieved_rps) for lv in sat.levels if lv.achieved_rps]
        ax.plot(
            [rate for rate, _ in achieved],
            [sp.median for _, sp in achieved],
            linestyle="--",
            color=line[0].get_color(),
            alpha=0.6,
            label=f"{sat.target} achieved",
        )
        if sat.point is not None and sat.status == "saturated":
            ax.axvline(sat.point, color=line[0].get_color(), linestyle=":", alpha=0.8)
    ax.set_xlabel("offered request rate (req/s, Poisson; median of rounds, bars: min–max)")
    ax.set_ylabel("req/s")
    ax.set_title(f"Goodput vs offered rate — {result.contract_name}")
    ax.grid(True, alpha=0.3)
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize="small")
    fig.tight_layout()
    path = out_dir / "goodput_vs_rate.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def _level_row(target: TargetResult, level: float) -> str:
    """One level over its rounds: medians (min-max) and the rounds' summed request counts."""
    rounds = list(target.rounds_at(level).values())

    def fig(figure: Callable[[LevelMetrics], float | None], digits: int = 1) -> str:
        return _spread(spread(target, level, figure), digits)

    requests = sum(m.requests for m in rounds)
    errors, short = sum(m.errors for m in rounds), sum(m.short for m in rounds)
    tokens = sum(m.output_tokens for m in rounds)
    expected = [m.expected_tokens for m in rounds]
    asked = "" if None in expected else f" of {sum(e or 0 for e in expected):,}"
    slo = sum(m.slo_met for m in rounds)
    noise = [m.noise.foreign_cpu_share_during for m in rounds if m.noise is not None]
    foreign = f"{max(noise):.0%}" if noise else "–"
    return (
        f"| {level:g} | {len(rounds)} | {fig(lambda m: m.output_tok_s)} | {tokens:,}{asked} "
        f"| {fig(lambda m: m.ttft_ms.p50, 0)} | {fig(lambda m: m.ttft_ms.p95, 0)} "
        f"| {fig(lambda m: m.tpot_ms.p50)} | {fig(lambda m: m.itl_ms.p50)} "
        f"| {fig(lambda m: m.e2e_ms.p50, 0)} | {fig(lambda m: m.goodput_rps, 2)} "
        f"| {errors} / {short} / {requests} | {slo}/{len(rounds)} | {foreign} |"
    )


def _target_table(target: TargetResult, mode: str) -> list[str]:
    head = "concurrency" if mode == "concurrency" else "rate"
    lines = [
        f"| {head} | rounds | out tok/s | tokens arrived (of forced) | TTFT p50 (ms) "
        "| TTFT p95 (ms) | TPOT p50 (ms) | ITL p50 (ms) | e2e p50 (ms) | goodput req/s "
        "| errors / short / requests | SLO met | foreign CPU (max) |",
        "|---:|---:|---|---:|---|---|---|---|---|---|---:|:-:|---:|",
    ]
    lines += [_level_row(target, level) for level in target.measured_levels()]
    for where, failure in target.failed_levels.items():
        first = failure.error.splitlines()[0] if failure.error else "failed"
        lines.append(f"| {where} | failed: {first} |||||||||||")
    return lines


def _failure_evidence(target: TargetResult) -> list[str]:
    """The end of the tool's own output for each failed level, so the cause is in the report."""
    lines: list[str] = []
    for level, failure in target.failed_levels.items():
        if failure.log_tail:
            lines += [f"Level {level}, {failure.error}:", "", "```", failure.log_tail.strip()]
            lines += ["```", ""]
    return lines


def _comparison_table(rows: list[ComparisonResult]) -> list[str]:
    # The TTFT-ratio columns appear only when some comparison sets that bound.
    ratios = any(r.max_ttft_p50_ratio is not None for r in rows)
    lines = [
        "| target vs baseline | level | rounds | tok/s ratio, median (min–max) | needed | verdict "
        "| TTFT p50 Δ ms, median (min–max) | allowed | verdict |"
        + (" TTFT p50 ratio, median (min–max) | allowed | verdict |" if ratios else ""),
        "|---|---:|---:|---|---:|---|---|---:|---|" + ("---|---:|---|" if ratios else ""),
    ]
    for r in rows:
        line = (
            f"| {r.target} vs {r.baseline} | {r.level:g} | {r.rounds} "
            f"| {_spread(r.throughput_ratio, 3)} | {_fmt(r.min_throughput_ratio, 2)} "
            f"| {_verdict(r.throughput_verdict)} "
            f"| {_spread(r.ttft_p50_delta_ms)} | {_fmt(r.max_ttft_p50_delta_ms)} "
            f"| {_verdict(r.ttft_verdict)} |"
        )
        if ratios:
            line += (
                f" {_spread(r.ttft_p50_ratio, 3)} | {_fmt(r.max_ttft_p50_ratio, 2)} "
                f"| {_verdict(r.ttft_ratio_verdict)} |"
            )
        lines.append(line)
    return lines


def _breakdown(result: RunResult) -> list[str]:
    """Server-side mean per-request times next to the client's TTFT, per level."""
    lines: list[str] = []
    for target in result.targets:
        for level, moved in target.server_metrics.items():
            times = per_request_ms(moved)
            if not times:
                continue
            client = spread(target, float(level), lambda m: m.ttft_ms.p50)
            ttft = f"client TTFT p50 {_spread(client, 0)} ms; " if client else ""
            parts = ", ".join(f"{k} {v:,.1f}" for k, v in sorted(times.items()))
            lines.append(f"- **{target.name}** at {level}: {ttft}server means (ms): {parts}")
    return lines


DEFINITIONS = [
    "## Definitions",
    "",
    "TTFT = request start → first streamed token. TPOT = (e2e − TTFT) / (output tokens − 1). "
    "ITL = gaps between streamed chunks. Output tokens are those that *arrived*: the server's "
    "own count (OpenAI `usage`, Triton's `num_output_tokens`) or the model's tokenizer over "
    "the received text (aiperf on Triton's generate_stream), never the max_tokens asked for. "
    "Output tok/s = all arrived tokens / level wall time. A request is *short* when it ended "
    "without error but delivered fewer tokens than `ignore_eos` forced; short and failed "
    "requests count against the error budget and never toward goodput (finished requests "
    "meeting both SLO bounds, per second).",
    "",
    "Each figure is the median over the interleaved rounds with the range (min–max) in "
    "brackets. A comparison pairs the two targets round by round: *met* when every round is "
    "on the right side of the threshold, *missed* when every round is on the wrong side, "
    "*inconclusive* when the rounds straddle it. No verdict is given for a *noisy* run "
    "(other processes took more CPU than the contract allows during some round), with "
    "fewer than 3 paired rounds, or against a target that did not run interleaved. Foreign "
    "CPU = share of the machine's CPU time used by processes that are not part of the run.",
    "",
]


def _contract_summary(result: RunResult) -> list[str]:
    """Title, then what was asked: the contract, its SLO, load and traffic."""
    c = result.contract
    slo, load, traffic = c["slo"], c["load"], c["traffic"]
    levels = Load.model_validate(load).levels
    if isinstance(load.get("request_rates"), dict):  # a sweep: say how it was built
        sweep = load["request_rates"]["sweep"]
        how = f"x{sweep['factor']:g}" if sweep.get("factor") else f"+{sweep['step']:g}"
        mode = f"request-rate sweep ({sweep['start']:g} {how} up to {sweep['max']:g}):"
    else:
        mode = result.load_mode
    return [
        f"# Benchmark report: `{result.contract_name}`",
        "",
        f"Contract `{result.contract_path}` (sha256 `{result.contract_sha256[:12]}`)"
        + (f", overrides: `{' '.join(result.overrides)}`" if result.overrides else "")
        + f". Run {result.started_at} → {result.finished_at}.",
        "",
        f"SLO: TTFT p95 ≤ {slo['ttft_p95_ms']:g} ms, TPOT p95 ≤ {slo['tpot_p95_ms']:g} ms, "
        f"errors ≤ {slo['error_budget']:.1%}. Load: {mode} "
        f"{', '.join(f'{lv:g}' for lv in levels)}; {load['requests_per_level']} requests "
        + (
            f"per level (at least {load.get('requests_per_concurrency', 0)} per unit of "
            "concurrency)"
            if result.load_mode == "concurrency"
            else "per rate"
        )
        + f" after {load['warmup_requests']} warm-up; each level of each target "
        f"in {result.rounds} interleaved round(s), the targets' order rotated per round.",
        "",
        "Traffic: "
        + "; ".join(f"{cls['name']} {cls['share']:.0%}" for cls in traffic["classes"])
        + f"; shared prefix on {traffic['shared_prefix']['share']:.0%} of requests "
        f"({traffic['shared_prefix']['tokens']} tokens).",
        "",
    ]


def _setup(env: Environment) -> list[str]:
    """Where the numbers come from: machine, code, model and versions."""
    return [
        "## Setup",
        "",
        f"- machine: {describe_machine(env.machine)}",
        f"- code: {describe_code(env)}",
        f"- model `{env.model.name}` sha256 `{env.model.sha256[:16]}…`",
        f"- server: {env.tritonserver}; serving venv: "
        + ", ".join(f"{k} {v}" for k, v in env.serving_versions.items()),
        "- benchmark venv: " + ", ".join(f"{k} {v}" for k, v in env.bench_versions.items()),
        "",
    ]


def _target_section(target: TargetResult, mode: str) -> list[str]:
    """One target: status line, its error, its table, failed levels' evidence, notes."""
    status = {"ok": "ok", "partial": "**partial**", "failed": "**FAILED**"}[target.status]
    start = f", ready in {target.startup_s:.0f} s" if target.startup_s is not None else ""
    if target.load_average_1m is not None:
        start += f", load average {target.load_average_1m:.2f} before measuring"
    model = f" `{target.model}`" if target.model else ""
    out = [f"### {target.name} ({target.kind}{model}, {target.tool}) — {status}{start}", ""]
    if target.error:
        out += ["```", target.error.strip()[-1200:], "```", ""]
    if target.levels or target.failed_levels:
        out += [*_target_table(target, mode), ""]
    out += _failure_evidence(target)
    out += [f"- {note}" for note in target.notes]
    if target.notes:
        out.append("")
    return out


def _noise(result: RunResult) -> list[str]:
    """Was the machine quiet? The run's state first, then every round's figures."""
    bound = result.max_foreign_cpu_share
    if bound is None:  # a run from before noise was recorded
        return ["## Noise", "", "Not recorded in this run: no verdict can rest on it.", ""]
    state = (
        f"**NOISY — no verdicts.** Other processes used more than {bound:.0%} of the machine "
        "during some round"
        if result.noisy
        else f"Quiet enough for verdicts: no round saw other processes above {bound:.0%} "
        "of the machine"
    )
    out = ["## Noise", "", f"{state} (most: {result.noisiest_round or 'nothing recorded'}).", ""]
    out += [
        "| target | level | round | foreign CPU before / during | load 1 m before / after "
        "| busiest other processes during the round |",
        "|---|---:|---:|---|---|---|",
    ]
    for target in result.targets:
        kept = [(m, "") for m in target.levels]
        dropped = [(m, " (discarded, measured again)") for m in target.discarded_rounds]
        for m, label in sorted(kept + dropped, key=lambda pair: (pair[0].level, pair[0].round)):
            if m.noise is None:
                continue
            n = m.noise
            out.append(
                f"| {target.name} | {m.level:g} | {m.round + 1}{label} "
                f"| {n.foreign_cpu_share_before:.0%} / {n.foreign_cpu_share_during:.0%} "
                f"| {n.load_1m_before:.1f} / {n.load_1m_after:.1f} "
                f"| {'; '.join(n.foreign_top) or '–'} |"
            )
    return [*out, ""]


def _point(sat: SaturationResult) -> str:
    """The saturation point as a reader needs it: a rate, a bound, or a hedge."""
    nxt = f"{sat.next_rate:g}" if sat.next_rate is not None else "–"
    if sat.status == "saturated":
        return f"**{sat.point:g} req/s** (broke at {nxt})"
    if sat.status == "below the lowest rate":
        return f"below {nxt} req/s (the lowest rate broke)"
    if sat.status == "not reached":
        return f"≥ {sat.point:g} req/s (every rate held)"
    if sat.status == "inconclusive":
        held = f"{sat.point:g} req/s held" if sat.point is not None else "no rate held"
        return f"inconclusive: {held}, rounds disagree at {nxt}"
    return "no data"


def _capacity(result: RunResult) -> list[str]:
    """Open loop: the saturation point per target, then goodput per offered rate."""
    if not result.saturation:
        return []
    rule = result.saturation[0]
    out = [
        "## Capacity (open loop, Poisson arrivals)",
        "",
        f"A round *holds* when its goodput share is ≥ {rule.min_goodput_share:.0%} and its "
        f"achieved rate is ≥ {rule.min_achieved_ratio:.0%} of its kept-up rate; a rate "
        "*held* when every round held, *broke* when none did, is *inconclusive* when they "
        "disagree. The saturation point is the highest rate that held with every rate "
        "below it (tritonforge/bench/saturation.py).",
        "",
        *(
            ["**This run was noisy: the points are measurements, not verdicts.**", ""]
            if result.noisy
            else []
        ),
        "| target | saturation point | status | note |",
        "|---|---|---|---|",
    ]
    for sat in result.saturation:
        out.append(f"| {sat.target} | {_point(sat)} | {sat.status} | {sat.caveat or '–'} |")
    out += [
        "",
        "### Goodput vs offered rate",
        "",
        "Offered = arrivals/s as sent (between the first and last arrival); achieved = "
        "finished requests over the round's wall time (first start → last completion); "
        "kept-up = what achieved would read had no request waited in a queue (each one's "
        "first-token wait cut to the round's shortest); goodput = achieved × (within SLO / "
        "finished). Medians over the rounds (min–max).",
        "",
        "| target | rate | rounds held | offered req/s | achieved req/s | kept-up req/s "
        "| achieved / kept-up | goodput share | goodput req/s | TTFT p95 (ms) | TPOT p95 (ms) "
        "| state |",
        "|---|---:|:-:|---|---|---|---|---|---|---|---|---|",
    ]
    for sat in result.saturation:
        for lv in sat.levels:
            out.append(
                f"| {sat.target} | {lv.rate:g} | {lv.held}/{lv.rounds} "
                f"| {_spread(lv.offered_rps, 2)} | {_spread(lv.achieved_rps, 2)} "
                f"| {_spread(lv.kept_up_rps, 2)} | {_spread(lv.achieved_ratio, 2)} "
                f"| {_spread(lv.goodput_share, 2)} "
                f"| {_spread(lv.goodput_rps, 2)} | {_spread(lv.ttft_p95_ms, 0)} "
                f"| {_spread(lv.tpot_p95_ms)} | {lv.state} |"
            )
    return [*out, ""]


def _analysis(result: RunResult) -> list[str]:
    """The comparisons the contract asks for and the server-side time breakdown, if any."""
    out: list[str] = []
    if result.comparisons:
        out += [
            "## Targets (judged on the rounds' spread, recorded, not asserted)",
            "",
            *(["**This run was noisy: the verdicts are withheld.**", ""] if result.noisy else []),
            *_comparison_table(result.comparisons),
            "",
        ]
    breakdown = _breakdown(result)
    if breakdown:
        out += [
            "## Where the time goes (server-side counters over each level)",
            "",
            "Means per request from each server's Prometheus counters, summed over the "
            "rounds; the gap between the client's TTFT and the engine's own "
            "TTFT/queue/prefill is the serving path's cost.",
            "",
            *breakdown,
            "",
        ]
    return out


def render(result: RunResult, plots: list[Path]) -> str:
    out = [*_contract_summary(result), *_setup(result.environment), "## Targets", ""]
    for target in result.targets:
        out += _target_section(target, result.load_mode)
    out += _capacity(result)
    out += _analysis(result)
    out += _noise(result)
    out += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots] + [""]
    return "\n".join(out + DEFINITIONS)


def write(result: RunResult, run_dir: Path) -> Path:
    plots = plot(result, run_dir)
    path = run_dir / "report.md"
    path.write_text(render(result, plots))
    return path
