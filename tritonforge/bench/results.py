"""The shape of ``results.json`` and the target-vs-baseline comparisons computed from it.

Every level of every target runs in several interleaved rounds. A comparison pairs the
two targets round by round (they ran back to back, in rotated order) and judges the
spread of the per-round figures, never one number:

- *met*: every round's figure is on the right side of the threshold;
- *missed*: every round's figure is on the wrong side;
- *inconclusive*: the rounds straddle the threshold — the difference is within noise;
- no verdict at all when the run was *noisy* (other processes took more than the
  contract's share of the CPU), when fewer than :data:`MIN_ROUNDS` rounds pair up, or
  when one side did not run interleaved with the other (the offline ceiling).

A request-rate run also records each target's saturation point
(:mod:`tritonforge.bench.saturation`).

Comparisons are recorded, never asserted: a benchmark on a shared two-core machine is
evidence for a decision, not a pass/fail test.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import BaseModel

from tritonforge.bench.contract import Comparison, Target
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
    # Rounds measured again because other processes took too much CPU during them:
    # the noisy measurements, kept for the record and left out of every figure.
    discarded_rounds: list[LevelMetrics] = []
    interleaved: bool = True  # False: ran alone after the servers (the offline ceiling)

    @classmethod
    def of(cls, target: Target, status: Literal["ok", "failed"], **fields: Any) -> TargetResult:
        """A served target's result, named and described as the contract names it."""
        return cls(
            name=target.name,
            kind=target.kind.value,
            model=target.model,
            tool=target.tool,
            status=status,
            **fields,
        )

    def rounds_at(self, level: float) -> dict[int, LevelMetrics]:
        """This level's metrics by round."""
        return {m.round: m for m in self.levels if m.level == level}

    def measured_levels(self) -> list[float]:
        return sorted({m.level for m in self.levels})


MIN_ROUNDS = 3
Verdict = Literal["met", "missed", "inconclusive", "noisy", "too few rounds", "not interleaved"]


class Spread(BaseModel):
    """A figure over the rounds: median and range."""

    median: float
    min: float
    max: float
    rounds: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread | None:
        if not values:
            return None
        return cls(
            median=statistics.median(values), min=min(values), max=max(values), rounds=len(values)
        )

    def text(self, digits: int = 1) -> str:
        """How every report shows a figure over the rounds: ``median (min-max)``, or just
        the value when there was one round."""
        if self.rounds == 1:
            return f"{self.median:,.{digits}f}"
        return f"{self.median:,.{digits}f} ({self.min:,.{digits}f}–{self.max:,.{digits}f})"


def spread_text(values: Sequence[float | None], digits: int = 1) -> str:
    """:meth:`Spread.text` of the values that exist; a dash when none do."""
    spread = Spread.of([v for v in values if v is not None])
    return "–" if spread is None else spread.text(digits)


def spread(
    target: TargetResult, level: float, figure: Callable[[LevelMetrics], float | None]
) -> Spread | None:
    """One figure of one target at one level, over its rounds."""
    values = [v for m in target.rounds_at(level).values() if (v := figure(m)) is not None]
    return Spread.of(values)


class ComparisonResult(BaseModel):
    """One comparison at one level: per-round ratios and deltas, and the verdicts."""

    target: str
    baseline: str
    level: float
    rounds: int = 0  # rounds where both sides have numbers
    throughput_ratio: Spread | None = None
    min_throughput_ratio: float | None = None
    throughput_verdict: Verdict | None = None  # None: the contract sets no threshold
    ttft_p50_delta_ms: Spread | None = None
    max_ttft_p50_delta_ms: float | None = None
    ttft_verdict: Verdict | None = None
    ttft_p50_ratio: Spread | None = None
    max_ttft_p50_ratio: float | None = None
    ttft_ratio_verdict: Verdict | None = None


LevelState = Literal["held", "broke", "inconclusive"]
SaturationStatus = Literal[
    "saturated", "below the lowest rate", "inconclusive", "not reached", "no data"
]


class RateLevel(BaseModel):
    """One target at one request rate, over its rounds."""

    rate: float  # the contract's nominal rate
    rounds: int  # rounds that ran or were meant to (a failed round did not hold)
    held: int  # rounds that held
    state: LevelState
    offered_rps: Spread | None = None
    achieved_rps: Spread | None = None
    kept_up_rps: Spread | None = None  # the achieved rate had no request queued
    achieved_ratio: Spread | None = None  # achieved / kept-up, per round
    goodput_share: Spread | None = None
    goodput_rps: Spread | None = None  # achieved req/s x good / finished, per round
    ttft_p95_ms: Spread | None = None
    tpot_p95_ms: Spread | None = None


class SaturationResult(BaseModel):
    """Where one target stopped keeping up, by the rule in :mod:`tritonforge.bench.saturation`."""

    target: str
    status: SaturationStatus
    point: float | None = None  # highest rate that held, with every rate below it
    next_rate: float | None = None  # the first rate that did not hold
    caveat: str | None = None  # why the point is not a verdict (noisy, too few rounds)
    min_goodput_share: float
    min_achieved_ratio: float
    levels: list[RateLevel] = []


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
    rounds: int = 1
    max_foreign_cpu_share: float | None = None
    noisy: bool = False  # some round saw more foreign CPU than allowed: no verdicts
    noisiest_round: str | None = None  # where the most foreign CPU was seen, and how much
    saturation: list[SaturationResult] = []  # per target, request-rate runs only

    def target(self, name: str) -> TargetResult | None:
        return next((t for t in self.targets if t.name == name), None)


def judge(
    values: Sequence[float],
    threshold: float | None,
    higher_is_better: bool,
    blocked: Verdict | None,
) -> Verdict | None:
    """met / missed / inconclusive from per-round values, unless something blocks a verdict."""
    if threshold is None:
        return None
    if blocked is not None:
        return blocked
    if len(values) < MIN_ROUNDS:
        return "too few rounds"
    sign = 1 if higher_is_better else -1
    if all(sign * (v - threshold) >= 0 for v in values):
        return "met"
    if all(sign * (v - threshold) < 0 for v in values):
        return "missed"
    return "inconclusive"


def target_row(
    text: str, values: Sequence[float], threshold: float | None, higher: bool, quiet: bool
) -> dict[str, Any]:
    """One target's record in a perf script's results: per-round ratios, the verdict by
    :func:`judge`, and whether the machine was quiet (the reader weighs the verdict by it)."""
    return {
        "target": text,
        "per_round": [round(v, 3) for v in values],
        "verdict": judge(values, threshold, higher, None),
        "machine_quiet": quiet,
    }


def compare(
    spec: Comparison,
    target: TargetResult,
    baseline: TargetResult,
    levels: list[float],
    noisy: bool = False,
) -> list[ComparisonResult]:
    """One row per level; the two sides are paired by round (a missing side: no row values)."""
    blocked: Verdict | None = None
    if not (target.interleaved and baseline.interleaved):
        blocked = "not interleaved"
    elif noisy:
        blocked = "noisy"
    rows = []
    for level in spec.levels or levels:
        mine, theirs = target.rounds_at(level), baseline.rounds_at(level)
        paired = sorted(set(mine) & set(theirs))
        ratios = [
            mine[r].output_tok_s / theirs[r].output_tok_s
            for r in paired
            if theirs[r].output_tok_s > 0
        ]
        ttfts = [
            (a, b)
            for r in paired
            if (a := mine[r].ttft_ms.p50) is not None and (b := theirs[r].ttft_ms.p50) is not None
        ]
        deltas = [a - b for a, b in ttfts]
        ttft_ratios = [a / b for a, b in ttfts if b > 0]
        rows.append(
            ComparisonResult(
                target=spec.target,
                baseline=spec.baseline,
                level=level,
                rounds=len(paired),
                throughput_ratio=Spread.of(ratios),
                min_throughput_ratio=spec.min_throughput_ratio,
                throughput_verdict=judge(ratios, spec.min_throughput_ratio, True, blocked),
                ttft_p50_delta_ms=Spread.of(deltas),
                max_ttft_p50_delta_ms=spec.max_ttft_p50_delta_ms,
                ttft_verdict=judge(deltas, spec.max_ttft_p50_delta_ms, False, blocked),
                ttft_p50_ratio=Spread.of(ttft_ratios),
                max_ttft_p50_ratio=spec.max_ttft_p50_ratio,
                ttft_ratio_verdict=judge(ttft_ratios, spec.max_ttft_p50_ratio, False, blocked),
            )
        )
    return rows
