"""Open-loop capacity: goodput per offered request rate, and where a target saturates.

At a request rate the load arrives whether or not the server keeps up (Poisson
arrivals), so the figure capacity planning needs is the highest rate a target still
serves within the SLO. Every rate runs in ``load.rounds`` interleaved rounds, and the
rule is judged round by round, like a comparison's verdict:

- a **round holds** when both
  - its goodput share (requests finished within both SLO bounds, over all sent — an
    error or a short answer counts against it) is at least ``min_goodput_share``, and
  - it kept up: its achieved rate (completions over the level's wall time) is at
    least ``min_achieved_ratio`` x its kept-up rate, the rate the same requests would
    have shown had none of them waited in a queue (see :mod:`tritonforge.bench.metrics`).
    Comparing with the arrival rate instead would call every short level broken: its
    wall time includes the last requests' own service time, queue or not;
  a round the tool could not complete (no numbers) does not hold;
- a **rate** *held* when every round held, *broke* when no round held, and is
  *inconclusive* when the rounds disagree;
- walking the rates upwards, the first rate that did not hold decides:
  - *broke* → **saturated**: the saturation point is the rate below it (every rate up to
    the point held in every round); *below the lowest rate* if the lowest rate broke;
  - *inconclusive* → **inconclusive**: the point is the last rate that held, but the
    next one is within noise, so the edge is not pinned down;
  - none → **not reached**: every measured rate held; the point is the highest of them
    (a lower bound).
  A rate that held again above the first one that did not is shown, never counted.

A saturation point is a measurement, not a verdict, when the run was noisy or had
fewer than :data:`MIN_ROUNDS` rounds: the report says so next to it.
"""

from __future__ import annotations

from collections.abc import Callable

from tritonforge.bench.contract import Saturation
from tritonforge.bench.metrics import LevelMetrics
from tritonforge.bench.results import (
    MIN_ROUNDS,
    LevelState,
    RateLevel,
    SaturationResult,
    SaturationStatus,
    Spread,
    TargetResult,
)


def achieved_ratio(m: LevelMetrics) -> float | None:
    """Achieved over kept-up rate: about 1 while the server keeps up, lower once it queues."""
    if m.kept_up_rps is None or m.achieved_rps is None or m.kept_up_rps <= 0:
        return None
    return m.achieved_rps / m.kept_up_rps


def open_goodput_rps(m: LevelMetrics) -> float | None:
    """Requests per second served within the SLO: achieved req/s x good / finished.

    The achieved rate counts finished requests only; the share of them within both
    bounds makes it goodput, which can never exceed what was completed.
    """
    finished = m.requests - m.errors - m.short
    if m.achieved_rps is None:
        return None
    return 0.0 if finished <= 0 else m.achieved_rps * (m.goodput_share * m.requests) / finished


def round_holds(m: LevelMetrics, rule: Saturation) -> bool:
    ratio = achieved_ratio(m)
    return (
        m.goodput_share >= rule.min_goodput_share
        and ratio is not None
        and ratio >= rule.min_achieved_ratio
    )


def level_state(holds: list[bool]) -> LevelState:
    if holds and all(holds):
        return "held"
    if not any(holds):
        return "broke"
    return "inconclusive"


def _failed_rounds(target: TargetResult, rate: float) -> int:
    """Rounds at this rate the tool could not complete (``failed_levels`` keys: '2 round 1')."""
    return sum(1 for key in target.failed_levels if float(key.split(" round ")[0]) == float(rate))


def rate_level(target: TargetResult, rate: float, rule: Saturation) -> RateLevel:
    rounds = list(target.rounds_at(rate).values())
    holds = [round_holds(m, rule) for m in rounds] + [False] * _failed_rounds(target, rate)

    def over(figure: Callable[[LevelMetrics], float | None]) -> Spread | None:
        return Spread.of([v for m in rounds if (v := figure(m)) is not None])

    return RateLevel(
        rate=rate,
        rounds=len(holds),
        held=sum(holds),
        state=level_state(holds),
        offered_rps=over(lambda m: m.offered_rps),
        achieved_rps=over(lambda m: m.achieved_rps),
        kept_up_rps=over(lambda m: m.kept_up_rps),
        achieved_ratio=over(achieved_ratio),
        goodput_share=over(lambda m: m.goodput_share),
        goodput_rps=over(open_goodput_rps),
        ttft_p95_ms=over(lambda m: m.ttft_ms.p95),
        tpot_p95_ms=over(lambda m: m.tpot_ms.p95),
    )


def attempted_rates(target: TargetResult) -> list[float]:
    failed = {float(key.split(" round ")[0]) for key in target.failed_levels}
    return sorted(set(target.measured_levels()) | failed)


def locate(levels: list[RateLevel]) -> tuple[SaturationStatus, float | None, float | None]:
    """(status, saturation point, first rate that did not hold) from ascending levels."""
    if not levels:
        return "no data", None, None
    point = None
    for level in levels:
        if level.state == "held":
            point = level.rate
            continue
        if level.state == "inconclusive":
            return "inconclusive", point, level.rate
        return ("saturated" if point is not None else "below the lowest rate"), point, level.rate
    return "not reached", point, None


def assess(
    target: TargetResult, rule: Saturation, rounds: int, noisy: bool = False
) -> SaturationResult:
    """The saturation point of one target from its per-round metrics."""
    levels = [rate_level(target, rate, rule) for rate in attempted_rates(target)]
    status, point, next_rate = locate(levels)
    caveat = None
    if noisy:
        caveat = "noisy run: a measurement, not a verdict"
    elif rounds < MIN_ROUNDS:
        caveat = f"{rounds} round(s), fewer than {MIN_ROUNDS}: a measurement, not a verdict"
    return SaturationResult(
        target=target.name,
        status=status,
        point=point,
        next_rate=next_rate,
        caveat=caveat,
        min_goodput_share=rule.min_goodput_share,
        min_achieved_ratio=rule.min_achieved_ratio,
        levels=levels,
    )
