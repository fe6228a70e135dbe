"""Verdicts of an overload run (:mod:`tritonforge.bench.overload`) against its contract's targets.

Why: the driver records cells; the targets are judged over the rounds, each round's
figure on its own side of the threshold (tritonforge/bench/results.py: met, missed or
inconclusive), so a single lucky round decides nothing.

    python -m tritonforge.bench overload-report perf/results/overload/<UTC>

Reads ``results.json`` (and ``noise.jsonl`` when the run was watched for other
processes' CPU), writes ``verdicts.json`` and prints the cells and verdicts as Markdown.
A target whose cells recorded their own noise is "noisy" only when one of those cells
was; without per-cell samples the whole run's windows decide for every target.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from tritonforge.bench.contract import Overload, load_contract
from tritonforge.bench.noise import all_quiet
from tritonforge.bench.results import judge, spread_text
from tritonforge.paths import REPO_ROOT

Cells = dict[tuple[float, str], list[dict[str, Any]]]


def by_cell(results: dict[str, Any]) -> Cells:
    """(multiple, mode) → its cells, in round order."""
    cells: Cells = defaultdict(list)
    for cell in sorted(results["cells"], key=lambda c: c["round"]):
        cells[(cell["multiple"], cell["mode"])].append(cell)
    return cells


def figures(cells: list[dict[str, Any]], key: str) -> list[float]:
    return [c[key] for c in cells if c.get(key) is not None]


def gain(with_admission: float, without: float) -> float:
    """Goodput with admission over goodput without; infinite when only one side had any."""
    if without > 0:
        return with_admission / without
    return math.inf if with_admission > 0 else 0.0


def row(
    target: str, values: list[float], threshold: float, higher: bool, quiet: bool
) -> dict[str, Any]:
    verdict = judge(values, threshold, higher, None if quiet else "noisy")
    return {"target": target, "per_round": [round(v, 3) for v in values], "verdict": verdict}


def low_load_gap(
    low_on: list[dict[str, Any]], low_off: list[dict[str, Any]]
) -> tuple[list[float], float]:
    """Per round |goodput on - off| below saturation, and each mode's own spread over its
    rounds (the larger): a gap between the modes beyond that spread is real."""
    gaps = [
        abs(a["goodput_rps"] - b["goodput_rps"])
        for a in low_on
        for b in low_off
        if a["round"] == b["round"]
    ]
    each = (figures(low_on, "goodput_rps"), figures(low_off, "goodput_rps"))
    return gaps, max((max(v) - min(v) for v in each if v), default=0.0)


def cells_quiet(cells: list[dict[str, Any]], max_foreign: float, run_quiet: bool) -> bool:
    """Whether other processes stayed under ``max_foreign`` of the CPU in every one of
    ``cells``; ``run_quiet`` (the whole run's windows) where a cell sampled none."""
    shares = [c["noise"]["foreign_cpu_share_during"] for c in cells if "noise" in c]
    if not cells or len(shares) < len(cells):
        return run_quiet
    return all_quiet(shares, max_foreign)


#: A target: its text, per-round figures, threshold, higher is better, the cells it reads.
Target = tuple[str, list[float], float, bool, list[dict[str, Any]]]


def contract_targets(results: dict[str, Any], overload: Overload) -> list[Target]:
    """Each of the contract's targets with the figures and cells it is judged from."""
    cells = by_cell(results)
    all_on = [c for (_, mode), cs in cells.items() if mode == "on" for c in cs]
    error = (
        f"TTFT prediction error p50 <= {overload.targets.max_ttft_error_p50:g}"
        " (its histogram bucket's bound, admission-on cells)",
        figures(all_on, "ttft_error_p50_at_most"),
        overload.targets.max_ttft_error_p50,
        False,
        all_on,
    )
    return [
        *overloaded_targets(cells, overload, results["sweep_peak_goodput_rps"] or 0.0),
        *low_load_targets(cells, overload),
        error,
    ]


def overloaded_targets(cells: Cells, overload: Overload, peak: float) -> list[Target]:
    """The targets at the overloaded multiple: goodput, promises kept, refusal time."""
    targets, at = overload.targets, overload.targets.at_multiple
    on, off = cells[(at, "on")], cells[(at, "off")]
    gains = [
        gain(a["goodput_rps"], b["goodput_rps"])
        for a in on
        for b in off
        if a["round"] == b["round"]
    ]
    return [
        (
            f"goodput with admission at {at:g}x / the sweep's peak ({peak:.2f} req/s)"
            f" >= {targets.min_goodput_share_of_peak:g}",
            [g / peak for g in figures(on, "goodput_rps")] if peak else [],
            targets.min_goodput_share_of_peak,
            True,
            on,
        ),
        (
            f"goodput at {at:g}x, admission on / off >= {targets.min_goodput_gain:g}",
            gains,
            targets.min_goodput_gain,
            True,
            on + off,
        ),
        (
            f"admitted requests within SLO at {at:g}x >= {targets.min_admitted_slo_share:g}",
            figures(on, "admitted_slo_share"),
            targets.min_admitted_slo_share,
            True,
            on,
        ),
        (
            f"refusal p99 at {at:g}x <= {targets.max_refusal_p99_ms:g} ms",
            figures(on, "refusal_p99_ms"),
            targets.max_refusal_p99_ms,
            False,
            on,
        ),
    ]


def low_load_targets(cells: Cells, overload: Overload) -> list[Target]:
    """The targets below saturation: admission must change nothing there."""
    low = overload.slo_check_multiple
    low_on, low_off = cells[(low, "on")], cells[(low, "off")]
    gaps, spread = low_load_gap(low_on, low_off)
    return [
        (f"refused at {low:g}x = 0", figures(low_on, "refused"), 0, False, low_on),
        (
            f"goodput at {low:g}x, abs(on - off) <= a mode's own spread ({spread:.3f} req/s)",
            gaps,
            spread,
            False,
            low_on + low_off,
        ),
    ]


def verdicts(
    results: dict[str, Any], overload: Overload, run_quiet: bool, max_foreign: float = 0.1
) -> list[dict[str, Any]]:
    """One row per target of the contract, judged from its per-round figures, "noisy"
    when a cell it reads (:func:`cells_quiet`) was not quiet."""
    return [
        row(
            text,
            [float(v) for v in values],
            threshold,
            higher,
            cells_quiet(read, max_foreign, run_quiet),
        )
        for text, values, threshold, higher, read in contract_targets(results, overload)
    ]


#: The cells' table: heading, the figure each cell records, its digits.
COLUMNS = [
    ("offered / round", "offered", 0),
    ("goodput req/s", "goodput_rps", 2),
    ("refused / round", "refused", 0),
    ("admitted within SLO", "admitted_slo_share", 2),
    ("refusal p99 ms", "refusal_p99_ms", 0),
    ("malformed request p99 ms", "malformed_p99_ms", 0),
    ("the same from a default-priority process", "malformed_own_process_p99_ms", 0),
    ("driver loop late p99 ms", "driver_lateness_p99_ms", 0),
    ("TTFT p50 s (admitted)", "ttft_p50_s", 2),
    ("unfinished or failed", "failed", 0),
]


def markdown(results: dict[str, Any], rows: list[dict[str, Any]], foreign: list[float]) -> str:
    peak = results["sweep_peak_goodput_rps"] or 0
    lines = [
        f"Saturation {results['saturation_rps']:g} req/s, "
        f"sweep peak goodput {peak:.2f} req/s; other processes' CPU share (per cell or"
        f" 30 s window): max {max(foreign, default=0):.3f},"
        f" median {statistics.median(foreign or [0]):.3f}. Driver scheduling:"
        f" {results.get('driver_scheduling', 'SCHED_OTHER (not recorded)')}.",
        "",
        "| x S | mode | " + " | ".join(c[0] for c in COLUMNS) + " |",
        "|---|---|" + "---|" * len(COLUMNS),
    ]
    for (multiple, mode), cells in sorted(by_cell(results).items()):
        spans = [spread_text(figures(cells, key), digits) for _, key, digits in COLUMNS]
        lines.append(f"| {multiple:g} | {mode} | " + " | ".join(spans) + " |")
    lines += ["", "| target | per round | verdict |", "|---|---|---|"]
    for r in rows:
        per_round = ", ".join(map(str, r["per_round"])) or "—"
        lines.append(f"| {r['target']} | {per_round} | **{r['verdict']}** |")
    return "\n".join(lines)


def foreign_shares(run: Path, results: dict[str, Any]) -> list[float]:
    """Other processes' CPU share: per cell when the driver sampled it, else per 30 s
    window of a watcher run beside the driver (``noise.jsonl``)."""
    cells = [c["noise"]["foreign_cpu_share_during"] for c in results["cells"] if "noise" in c]
    if cells:
        return cells
    noise = run / "noise.jsonl"
    if not noise.exists():
        return []
    return [json.loads(line)["foreign_cpu_share"] for line in noise.read_text().splitlines()]


def main(run: Path) -> int:
    results = json.loads((run / "results.json").read_text())
    contract, _ = load_contract(REPO_ROOT / results["contract"])
    assert contract.overload is not None
    foreign = foreign_shares(run, results)
    quiet = bool(foreign) and all_quiet(foreign, contract.load.max_foreign_cpu_share)
    limit = contract.load.max_foreign_cpu_share
    rows = verdicts(results, contract.overload, quiet, limit)
    verdict_file = {"machine_quiet": quiet, "targets": rows}
    (run / "verdicts.json").write_text(json.dumps(verdict_file, indent=1) + "\n")
    print(markdown(results, rows, foreign))
    return 0
