"""Verdicts of an overload run: each target judged over the rounds, from recorded cells."""

from __future__ import annotations

from typing import Any

from tritonforge.bench import overload_report as report
from tritonforge.bench.contract import Overload

OVERLOAD = Overload(saturation_multiples=[0.5, 1, 2], warmup_s=60, duration_s=200)


def cell(round_: int, multiple: float, mode: str, goodput: float, **extra: Any) -> dict:
    figures = {"refused": 0, "admitted_slo_share": 1.0, "refusal_p99_ms": None}
    figures |= {"ttft_error_p50_at_most": 0.1, "offered": 100, "failed": 0, "ttft_p50_s": 0.2}
    return {"round": round_, "multiple": multiple, "mode": mode, "goodput_rps": goodput} | (
        figures | extra
    )


def run(low_on: list[float], low_off: list[float], high_off: list[float]) -> dict[str, Any]:
    cells = []
    for r in range(3):
        cells += [cell(r, 0.5, "on", low_on[r]), cell(r, 0.5, "off", low_off[r])]
        cells += [
            cell(r, 2, "on", 5.0, refused=300, admitted_slo_share=0.97, refusal_p99_ms=30),
            cell(r, 2, "off", high_off[r]),
        ]
    return {"sweep_peak_goodput_rps": 6.0, "cells": cells}


def test_admission_that_keeps_its_promises_meets_every_target() -> None:
    rows = report.verdicts(run([3.0, 3.1, 2.9], [3.05, 2.95, 3.0], [1.0, 0.0, 1.5]), OVERLOAD, True)
    assert [row["verdict"] for row in rows] == ["met"] * len(rows)
    gain = next(row for row in rows if "on / off" in row["target"])
    assert gain["per_round"] == [5.0, float("inf"), 3.333]  # none good without admission: inf


def test_below_saturation_a_gap_beyond_each_modes_spread_is_missed() -> None:
    rows = report.verdicts(run([2.0, 2.1, 2.05], [3.0, 3.05, 2.95], [1.0] * 3), OVERLOAD, True)
    low = next(row for row in rows if row["target"].startswith("goodput at 0.5x"))
    assert low["verdict"] == "missed"


def test_a_busy_machine_gets_no_verdict() -> None:
    rows = report.verdicts(run([3.0] * 3, [3.0] * 3, [1.0] * 3), OVERLOAD, False)
    assert {row["verdict"] for row in rows} == {"noisy"}


def _noisy(results: dict[str, Any], multiple: float, mode: str, share: float) -> dict[str, Any]:
    """Every cell sampled its noise: quiet ones 0.01, ``multiple`` x ``mode`` ``share``."""
    for c in results["cells"]:
        noisy = (c["multiple"], c["mode"]) == (multiple, mode)
        c["noise"] = {"foreign_cpu_share_during": share if noisy else 0.01}
    return results


def test_a_noisy_cell_makes_only_the_targets_that_read_it_noisy() -> None:
    results = _noisy(run([3.0] * 3, [3.0] * 3, [1.0] * 3), 0.5, "off", 0.2)
    rows = {row["target"]: row["verdict"] for row in report.verdicts(results, OVERLOAD, False)}
    noisy = {target for target, verdict in rows.items() if verdict == "noisy"}
    assert noisy == {next(t for t in rows if t.startswith("goodput at 0.5x"))}
    assert rows[next(t for t in rows if t.startswith("refused at 0.5x"))] == "met"


def test_per_cell_samples_under_the_bound_are_quiet_whatever_the_run_windows_say() -> None:
    results = _noisy(run([3.0] * 3, [3.0] * 3, [1.0] * 3), 2, "on", 0.05)
    rows = report.verdicts(results, OVERLOAD, False, max_foreign=0.1)
    assert "noisy" not in {row["verdict"] for row in rows}


def test_the_table_sets_refusals_beside_the_malformed_request_floor() -> None:
    results = run([3.0] * 3, [3.0] * 3, [1.0] * 3) | {"saturation_rps": 3}
    for c in results["cells"]:
        if c["multiple"] == 2 and c["mode"] == "on":
            c["malformed_p99_ms"] = 25.0 + c["round"]
            c["malformed_own_process_p99_ms"] = 12.0 + c["round"]
            c["driver_lateness_p99_ms"] = 3.0
    rows = report.verdicts(results, OVERLOAD, True)
    table = report.markdown(results, rows, [0.01]).splitlines()
    heading = next(line for line in table if line.startswith("| x S |"))
    on_at_2 = next(line for line in table if line.startswith("| 2 | on |"))
    column = heading.split(" | ").index("malformed request p99 ms")
    assert on_at_2.split(" | ")[column] == "26 (25–27)"
    assert heading.split(" | ")[column - 1] == "refusal p99 ms"
    assert on_at_2.split(" | ")[column + 1] == "13 (12–14)"  # the blocking client's probe
    assert on_at_2.split(" | ")[column + 2] == "3 (3–3)"  # how late the driver's loop was
    low = next(line for line in table if line.startswith("| 0.5 | on |"))
    assert low.split(" | ")[column] == "–"  # cells without probes (older runs) say so


def test_the_report_says_how_the_driver_was_scheduled() -> None:
    results = run([3.0] * 3, [3.0] * 3, [1.0] * 3) | {"saturation_rps": 3}
    rows = report.verdicts(results, OVERLOAD, True)
    assert "Driver scheduling: SCHED_OTHER (not recorded)." in report.markdown(results, rows, [])
    results["driver_scheduling"] = "SCHED_FIFO 10; the own-process probe at SCHED_OTHER"
    assert "Driver scheduling: SCHED_FIFO 10;" in report.markdown(results, rows, [])
