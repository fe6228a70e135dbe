"""report.md of a serving-ceiling run: medians over the rounds with their ranges.

Per level: every target's tokens/s, tokens per response, server CPU per token (all
server processes, then per role), the client's CPU per token, TTFT and ITL p50/p99;
then every target against the baseline (the Python floor) round by round — tokens/s
ratio and server CPU per response ratio, paired within a round because they ran back
to back.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from tritonforge.bench.results import spread_text


def _spread(values: Sequence[float | None], digits: int = 0) -> str:
    """A figure over the rounds as every report shows it; whole numbers unless told."""
    return spread_text(values, digits)


def _roles(rows: Sequence[dict[str, Any]]) -> list[str]:
    roles = {role for row in rows for role in row["cpu_us_per_token"]}
    return sorted(roles - {"client"}, key=lambda r: (r != "tritonserver", r))


def level_table(rows: Sequence[dict[str, Any]], targets: Sequence[str]) -> list[str]:
    roles = _roles(rows)
    header = [
        "target",
        "tokens/s",
        "tokens/response",
        "server CPU µs/token",
        *(f"{r} µs/token" for r in roles),
        "client CPU µs/token",
        "TTFT p50 / p99 ms",
        "ITL p50 / p99 ms",
        "per-stream tokens/s after the first, p50 / p10",
        "errors",
    ]
    counted = any("spans" in r for r in rows)  # a run with a span receiver
    header += ["spans received"] if counted else []
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for target in targets:
        mine = [r for r in rows if r["target"] == target]
        if not mine:
            continue
        cells = [
            target,
            _spread([r["tokens_per_s"] for r in mine]),
            _spread([r["tokens_per_response"] for r in mine], 2),
            _spread([r["server_cpu_us_per_token"] for r in mine]),
            *(_spread([r["cpu_us_per_token"].get(role) for r in mine]) for role in roles),
            _spread([r["cpu_us_per_token"].get("client") for r in mine]),
            f"{_spread([r['ttft_ms']['p50'] for r in mine], 1)} / "
            f"{_spread([r['ttft_ms']['p99'] for r in mine], 1)}",
            f"{_spread([r['itl_ms']['p50'] for r in mine], 2)} / "
            f"{_spread([r['itl_ms']['p99'] for r in mine], 2)}",
            f"{_spread([r['stream_tokens_per_s']['p50'] for r in mine], 1)} / "
            f"{_spread([r['stream_tokens_per_s']['p10'] for r in mine], 1)}",
            str(sum(r["errors"] for r in mine)),
        ]
        if counted:
            cells.append(_spread([r.get("spans") for r in mine]))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def baseline_table(
    rows: Sequence[dict[str, Any]], targets: Sequence[str], baseline: str
) -> list[str]:
    by_round = {(r["target"], r["round"]): r for r in rows}
    lines = [
        f"| target | tokens/s ÷ {baseline} | server CPU per response ÷ {baseline} |",
        "|---|---|---|",
    ]
    for target in targets:
        if target == baseline:
            continue
        speed, cost = [], []
        for (name, round_index), row in by_round.items():
            base = by_round.get((baseline, round_index))
            if name != target or base is None or not base["tokens_per_s"]:
                continue
            speed.append(row["tokens_per_s"] / base["tokens_per_s"])
            if row["server_cpu_us_per_response"] and base["server_cpu_us_per_response"]:
                cost.append(row["server_cpu_us_per_response"] / base["server_cpu_us_per_response"])
        lines.append(f"| {target} | {_spread(speed, 2)} | {_spread(cost, 2)} |")
    return lines


def server_lines(servers: Sequence[dict[str, Any]]) -> list[str]:
    """The run's servers and what set each apart (nothing when there was one)."""
    if len(servers) < 2:
        return []
    lines = ["- servers, all up for the whole run:"]
    for server in servers:
        settings = [f"`{k}={v}`" for k, v in server["env"].items()]
        settings += [f"`{a}`" for a in server["triton_args"]]
        lines.append(f"  - {server['name']}: {', '.join(settings) or 'as `make serve` runs it'}")
    return lines


def verdict_lines(verdicts: Sequence[dict[str, Any]]) -> list[str]:
    """Each comparison's per-round ratios and its verdict."""
    lines = [
        "| target ÷ baseline | concurrency | server CPU/token ratio per round | allowed "
        "| verdict | tokens/s ratio per round |",
        "|---|---|---|---|---|---|",
    ]
    for v in verdicts:
        cpu = ", ".join(f"{r:.3f}" for r in v["server_cpu_ratio_per_round"])
        speed = ", ".join(f"{r:.3f}" for r in v["tokens_per_s_ratio_per_round"])
        verdict = v["verdict"] or "n/a"
        lines.append(
            f"| {v['target']} ÷ {v['baseline']} | {v['concurrency']} | {cpu} "
            f"| ≤ {v['max_server_cpu_ratio']:g} | **{verdict}** | {speed} |"
        )
    return lines


def noise_lines(rows: Sequence[dict[str, Any]], bound: float) -> list[str]:
    shares = [r["noise"]["foreign_cpu_share_during"] for r in rows]
    noisy = [r for r in rows if r["noisy"]]
    lines = [
        f"Foreign CPU share during the measurements: median {statistics.median(shares):.1%}, "
        f"max {max(shares):.1%} (bound {bound:.0%}); {len(noisy)} of {len(rows)} "
        "measurements above the bound."
    ]
    tops: defaultdict[str, int] = defaultdict(int)
    for row in noisy:
        for entry in row["noise"]["foreign_top"]:
            tops[entry.split(" (")[0]] += 1
    if tops:
        named = ", ".join(f"{name} ({count}×)" for name, count in sorted(tops.items()))
        lines.append(f"Busiest other processes in the noisy ones: {named}.")
    return lines


def render(payload: dict[str, Any]) -> str:
    contract, env, rows = payload["contract"], payload["environment"], payload["rows"]
    targets = [t["name"] for t in contract["targets"]]
    load = contract["load"]
    machine = env["machine"]
    dirty = payload.get("uncommitted_files_at_launch", [])
    out = [
        f"# {contract['name']}",
        "",
        contract["description"].strip(),
        "",
        f"- code: {env['git_commit'][:12]}{' (uncommitted changes)' if env['git_dirty'] else ''}"
        f"; {env['tritonserver']}; machine: {machine.get('cpu_model', '?')}, "
        f"{machine.get('cores', '?')} cores",
        f"- load: {load['output_tokens']} tokens a request, concurrency "
        f"{', '.join(map(str, load['concurrency']))}, {load['rounds']} interleaved rounds "
        "(targets' order rotated)",
        *server_lines(contract.get("servers", [])),
        *(
            [f"- uncommitted files at launch: {', '.join(dirty) or 'none'}"]
            if "uncommitted_files_at_launch" in payload
            else []
        ),
        f"- overrides: {', '.join(payload['overrides']) or 'none'}",
        "- figures: median over the rounds (min–max); CPU is per token that arrived",
        "",
    ]
    for concurrency in load["concurrency"]:
        level = [r for r in rows if r["concurrency"] == concurrency]
        if not level:
            continue
        out += [f"## Concurrency {concurrency}", "", *level_table(level, targets), ""]
        out += [*baseline_table(level, targets, contract["baseline"]), ""]
    if payload.get("verdicts"):
        out += [
            "## Verdicts",
            "",
            "Met when every round's ratio is within the bound, missed when every round's "
            "is beyond it, inconclusive when the rounds straddle it; none when a paired "
            "measurement was noisy.",
            "",
            *verdict_lines(payload["verdicts"]),
            "",
        ]
    out += ["## Noise", "", *noise_lines(rows, load["max_foreign_cpu_share"]), ""]
    return "\n".join(out) + "\n"
