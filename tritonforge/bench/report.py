"""``report.md`` and its PNG plots, written from a :class:`RunResult` alone.

The report is generated only from results.json's model, so a report can be rebuilt
from an old run (``python -m tritonforge.bench report DIR``) and never shows a number
that is not in the results file.
"""

from __future__ import annotations

from pathlib import Path

from tritonforge.bench.environment import Environment, describe_machine
from tritonforge.bench.results import ComparisonResult, RunResult, TargetResult
from tritonforge.bench.server_metrics import per_request_ms

PLOTS = (
    ("throughput.png", "Output tokens/s", lambda m: m.output_tok_s, None),
    ("ttft_p95.png", "TTFT p95 (ms)", lambda m: m.ttft_ms.p95, "ttft_p95_ms"),
    ("goodput.png", "Goodput (requests/s within SLO)", lambda m: m.goodput_rps, None),
)


def _fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _verdict(met: bool | None) -> str:
    return "n/a" if met is None else ("met" if met else "**missed**")


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
            points = [(m.level, value(m)) for m in target.levels if value(m) is not None]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o", label=target.name)
        if slo_key:
            bound = result.contract["slo"][slo_key]
            ax.axhline(bound, color="grey", linestyle="--", linewidth=1, label=f"SLO {bound:g} ms")
        levels = sorted({m.level for t in result.targets for m in t.levels})
        if len(levels) > 2 and levels[-1] / max(levels[0], 1e-9) >= 8:
            ax.set_xscale("log", base=2)
        if levels:
            ax.set_xticks(levels, [f"{lv:g}" for lv in levels])
        ax.set_xlabel(xlabel)
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
    return paths


def _target_table(target: TargetResult, mode: str) -> list[str]:
    head = "concurrency" if mode == "concurrency" else "rate"
    lines = [
        f"| {head} | out tok/s | req/s | TTFT p50 / p95 / p99 (ms) | TPOT p50 / p95 (ms) "
        "| ITL p50 / p95 (ms) | e2e p50 / p95 (ms) | goodput req/s (share) | errors | SLO |",
        "|---:|---:|---:|---|---|---|---|---|---:|:-:|",
    ]
    for m in target.levels:
        lines.append(
            f"| {m.level:g} | {_fmt(m.output_tok_s)} | {_fmt(m.requests_s, 2)} "
            f"| {_fmt(m.ttft_ms.p50, 0)} / {_fmt(m.ttft_ms.p95, 0)} / {_fmt(m.ttft_ms.p99, 0)} "
            f"| {_fmt(m.tpot_ms.p50)} / {_fmt(m.tpot_ms.p95)} "
            f"| {_fmt(m.itl_ms.p50)} / {_fmt(m.itl_ms.p95)} "
            f"| {_fmt(m.e2e_ms.p50, 0)} / {_fmt(m.e2e_ms.p95, 0)} "
            f"| {_fmt(m.goodput_rps, 2)} ({m.goodput_share:.0%}) | {m.errors}/{m.requests} "
            f"| {'✓' if m.slo_met else '✗'} |"
        )
    for level, failure in target.failed_levels.items():
        first = failure.error.splitlines()[0] if failure.error else "failed"
        lines.append(f"| {level} | failed: {first} |||||||||")
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
    lines = [
        "| target vs baseline | level | tok/s ratio | needed | | TTFT p50 Δ (ms) | allowed | |",
        "|---|---:|---:|---:|---|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.target} vs {r.baseline} | {r.level:g} | {_fmt(r.throughput_ratio, 3)} "
            f"| {_fmt(r.min_throughput_ratio, 2)} | {_verdict(r.throughput_met)} "
            f"| {_fmt(r.ttft_p50_delta_ms)} | {_fmt(r.max_ttft_p50_delta_ms)} "
            f"| {_verdict(r.ttft_met)} |"
        )
    return lines


def _breakdown(result: RunResult) -> list[str]:
    """Server-side mean per-request times next to the client's TTFT, per level."""
    lines: list[str] = []
    for target in result.targets:
        for level, moved in target.server_metrics.items():
            times = per_request_ms(moved)
            if not times:
                continue
            client = target.at(float(level))
            ttft = f"client TTFT p50 {_fmt(client.ttft_ms.p50, 0)} ms; " if client else ""
            parts = ", ".join(f"{k} {v:,.1f}" for k, v in sorted(times.items()))
            lines.append(f"- **{target.name}** at {level}: {ttft}server means (ms): {parts}")
    return lines


DEFINITIONS = [
    "## Definitions",
    "",
    "TTFT = request start → first streamed token. TPOT = (e2e − TTFT) / (output tokens − 1). "
    "ITL = gaps between streamed chunks. Output tok/s = output tokens of successful requests / "
    "level wall time. Goodput = requests meeting both SLO bounds per second. Output counts are "
    "the max_tokens sent when the contract sets `ignore_eos` (the engine generates exactly "
    "that).",
    "",
]


def _contract_summary(result: RunResult) -> list[str]:
    """Title, then what was asked: the contract, its SLO, load and traffic."""
    c = result.contract
    slo, load, traffic = c["slo"], c["load"], c["traffic"]
    levels = load["concurrency"] or load["request_rates"]
    return [
        f"# Benchmark report: `{result.contract_name}`",
        "",
        f"Contract `{result.contract_path}` (sha256 `{result.contract_sha256[:12]}`)"
        + (f", overrides: `{' '.join(result.overrides)}`" if result.overrides else "")
        + f". Run {result.started_at} → {result.finished_at}.",
        "",
        f"SLO: TTFT p95 ≤ {slo['ttft_p95_ms']:g} ms, TPOT p95 ≤ {slo['tpot_p95_ms']:g} ms, "
        f"errors ≤ {slo['error_budget']:.1%}. Load: {result.load_mode} "
        f"{', '.join(f'{lv:g}' for lv in levels)}, {load['requests_per_level']} requests "
        f"per level (at least {load.get('requests_per_concurrency', 0)} per unit of "
        f"concurrency) after {load['warmup_requests']} warm-up.",
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
        f"- git commit `{env.git_commit[:12]}`"
        + (" (with uncommitted changes)" if env.git_dirty else ""),
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


def _analysis(result: RunResult) -> list[str]:
    """The comparisons the contract asks for and the server-side time breakdown, if any."""
    out: list[str] = []
    if result.comparisons:
        out += [
            "## Targets of the issue (recorded, not asserted)",
            "",
            *_comparison_table(result.comparisons),
            "",
        ]
    breakdown = _breakdown(result)
    if breakdown:
        out += [
            "## Where the time goes (server-side counters over each level)",
            "",
            "Means per request from each server's Prometheus counters; the gap between the "
            "client's TTFT and the engine's own TTFT/queue/prefill is the serving path's cost.",
            "",
            *breakdown,
            "",
        ]
    return out


def render(result: RunResult, plots: list[Path]) -> str:
    out = [*_contract_summary(result), *_setup(result.environment), "## Targets", ""]
    for target in result.targets:
        out += _target_section(target, result.load_mode)
    out += _analysis(result)
    out += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots] + [""]
    return "\n".join(out + DEFINITIONS)


def write(result: RunResult, run_dir: Path) -> Path:
    plots = plot(result, run_dir)
    path = run_dir / "report.md"
    path.write_text(render(result, plots))
    return path
