"""The shape of ``results.json`` and the target-vs-baseline comparisons computed from it.

Comparisons are recorded (met / missed with the numbers), never asserted: a benchmark
on a shared two-core machine is evidence for a decision, not a pass/fail test.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from tritonforge.bench.contract import Comparison
from tritonforge.bench.environment import Environment
from tritonforge.bench.metrics import LevelMetrics


class LevelFailure(BaseModel):
    """Why a level has no numbers, with the tool's exit code and the end of its output."""

    error: str
    exit_code: int | None = None  # None: no exit code (killed at the time-out, or not a tool)
    log_tail: str = ""


class TargetResult(BaseModel):
    name: str
    kind: str
    model: str | None = None
    tool: str
    status: Literal["ok", "partial", "failed"]
    error: str | None = None
    startup_s: float | None = None
    load_average_1m: float | None = None  # before measuring: >~0.5 means a noisy neighbour
    levels: list[LevelMetrics] = []
    failed_levels: dict[str, LevelFailure] = {}
    server_metrics: dict[str, dict[str, float]] = {}
    notes: list[str] = []

    def at(self, level: float) -> LevelMetrics | None:
        return next((m for m in self.levels if m.level == level), None)


class ComparisonResult(BaseModel):
    target: str
    baseline: str
    level: float
    throughput_ratio: float | None
    min_throughput_ratio: float | None
    throughput_met: bool | None
    ttft_p50_delta_ms: float | None
    max_ttft_p50_delta_ms: float | None
    ttft_met: bool | None


class RunResult(BaseModel):
    contract_name: str
    contract_path: str
    contract_sha256: str
    overrides: list[str]
    contract: dict[str, Any]
    started_at: str
    finished_at: str
    load_mode: str
    environment: Environment
    targets: list[TargetResult]
    comparisons: list[ComparisonResult]

    def target(self, name: str) -> TargetResult | None:
        return next((t for t in self.targets if t.name == name), None)


def compare(
    spec: Comparison, target: TargetResult, baseline: TargetResult, levels: list[float]
) -> list[ComparisonResult]:
    """One row per level where both sides have numbers (a missing side gives None, not a drop)."""
    rows = []
    for level in spec.levels or levels:
        mine, theirs = target.at(level), baseline.at(level)
        ratio = delta = None
        if mine and theirs and theirs.output_tok_s > 0:
            ratio = mine.output_tok_s / theirs.output_tok_s
        if mine and theirs and mine.ttft_ms.p50 is not None and theirs.ttft_ms.p50 is not None:
            delta = mine.ttft_ms.p50 - theirs.ttft_ms.p50
        rows.append(
            ComparisonResult(
                target=spec.target,
                baseline=spec.baseline,
                level=level,
                throughput_ratio=ratio,
                min_throughput_ratio=spec.min_throughput_ratio,
                throughput_met=None
                if ratio is None or spec.min_throughput_ratio is None
                else ratio >= spec.min_throughput_ratio,
                ttft_p50_delta_ms=delta,
                max_ttft_p50_delta_ms=spec.max_ttft_p50_delta_ms,
                ttft_met=None
                if delta is None or spec.max_ttft_p50_delta_ms is None
                else delta <= spec.max_ttft_p50_delta_ms,
            )
        )
    return rows
