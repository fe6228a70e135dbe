"""The choice between candidates on one hardware track, and why each other one lost.

The order of evidence, and why:

1. **Goodput within SLO**, per load level, from a contract run's interleaved rounds. One
   candidate *beats* another at a level when its goodput is higher in every paired
   round — :func:`tritonforge.bench.results.judge` on the per-round ratios, so a noisy
   run, too few rounds or a side that did not run interleaved decide nothing, exactly as
   every comparison of the bench. A candidate no other beats at any level is on the
   *front*.
2. **Operability**, when the front holds several candidates (tied within noise): fewer
   faults an operator must live with (:meth:`operability.Candidate.faults`).
3. **Exit cost**: fewer checks of the application contract it does not pass.
4. Then the higher median goodput at the heaviest load, said as such (not a verdict).

A candidate that failed to run, or kept no request within the SLO at any load, loses on
that alone; when none kept any, there is no choice (the SLO, the load or the hardware has
to change first). Nothing here is a verdict the rounds
did not give: a tie broken by operability is recorded as a tie.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from tritonforge.bench.decision.operability import Candidate as OperabilityCandidate
from tritonforge.bench.exit_cost.results import SuiteResult
from tritonforge.bench.overload_report import gain
from tritonforge.bench.results import RunResult, TargetResult, Verdict, judge


@dataclass
class Beat:
    """``winner`` had more goodput than ``loser`` at ``level`` in every paired round."""

    winner: str
    loser: str
    level: float
    ratios: list[float]  # winner / loser, per paired round
    verdict: Verdict | None


@dataclass
class Decision:
    track: str
    choice: str | None
    why: str
    front: list[str]
    beats: list[Beat] = field(default_factory=list)
    lost: dict[str, list[str]] = field(default_factory=dict)  # candidate → reasons


def goodput_rounds(target: TargetResult, level: float) -> dict[int, float]:
    """Goodput within SLO (req/s) per round at one level."""
    return {r: m.goodput_rps for r, m in target.rounds_at(level).items()}


def ratio(mine: float, theirs: float) -> float:
    """Goodput over goodput; two zeros are a tie, one zero an infinite gap."""
    return 1.0 if mine == theirs == 0 else gain(mine, theirs)


def blocked(result: RunResult, a: TargetResult, b: TargetResult) -> Verdict | None:
    """What keeps two targets' rounds from a verdict, as :func:`results.compare` says it."""
    if not (a.interleaved and b.interleaved):
        return "not interleaved"
    return "noisy" if result.noisy else None


def head_to_head(result: RunResult, a: TargetResult, b: TargetResult, level: float) -> Beat:
    """a against b at one level: the per-round ratios and their verdict (≥ 1 every round)."""
    mine, theirs = goodput_rounds(a, level), goodput_rounds(b, level)
    ratios = [ratio(mine[r], theirs[r]) for r in sorted(set(mine) & set(theirs))]
    verdict = judge(ratios, 1.0, True, blocked(result, a, b))
    return Beat(a.name, b.name, level, ratios, verdict)


def beats(result: RunResult, names: list[str]) -> list[Beat]:
    """Every decided win: higher goodput in every paired round, at least one strictly."""
    out = []
    targets = [t for t in result.targets if t.name in names]
    for level in sorted({lv for t in targets for lv in t.measured_levels()}):
        for a in targets:
            for b in targets:
                if a is b:
                    continue
                beat = head_to_head(result, a, b, level)
                if beat.verdict == "met" and any(r > 1.0 for r in beat.ratios):
                    out.append(beat)
    return out


def slo_verdict(result: RunResult, target: TargetResult, level: float) -> Verdict | None:
    """Did the target hold the SLO at this level — met (every round), missed (none) or
    inconclusive — by :func:`judge` on each round's SLO outcome."""
    held = [1.0 if m.slo_met else 0.0 for m in target.rounds_at(level).values()]
    return judge(held, 1.0, True, "noisy" if result.noisy else None)


def operability_of(
    name: str, candidates: list[OperabilityCandidate]
) -> OperabilityCandidate | None:
    return next((c for c in candidates if name in c.target_names()), None)


def exit_cost_of(name: str, suites: list[SuiteResult]) -> SuiteResult | None:
    return next((s for s in suites if name in s.target_names()), None)


def exit_faults(suite: SuiteResult | None) -> list[str]:
    """The application-contract checks a candidate does not pass (run ones only)."""
    if suite is None:
        return []
    return [f"{c.check} {c.status}" for c in suite.checks if c.status in ("failed", "unsupported")]


def _top_median(target: TargetResult) -> float:
    levels = target.measured_levels()
    if not levels:
        return 0.0
    values = list(goodput_rounds(target, levels[-1]).values())
    return statistics.median(values) if values else 0.0


def decide(
    result: RunResult,
    track: str,
    operability: list[OperabilityCandidate],
    exit_cost: list[SuiteResult],
    only: list[str] | None = None,
) -> Decision:
    """The choice among the run's targets on ``track`` (``only`` these, when given), and
    each other's reasons to lose. A target that did not run interleaved with the others
    (the offline engine) cannot be judged against them, so it is no candidate."""
    targets = [t for t in result.targets if not only or t.name in only]
    by_name = {t.name: t for t in targets}
    failed = {t.name: t for t in targets if t.status == "failed" or not t.levels}
    apart = [t.name for t in targets if t.name not in failed and not t.interleaved]
    alive = [t.name for t in targets if t.name not in failed and t.interleaved]
    lost: dict[str, list[str]] = {
        name: [f"did not run: {(t.error or 'no level measured').splitlines()[0][:200]}"]
        for name, t in failed.items()
    }
    lost |= {n: ["not interleaved with the others: measured beside, not judged"] for n in apart}
    if not alive:
        return Decision(track, None, "no candidate measured on this track", [], [], lost)
    some = [n for n in alive if any(m.goodput_rps > 0 for m in by_name[n].levels)]
    for name in alive:
        if name not in some:
            lost[name] = ["no request within the SLO at any load"]
    if not some:
        why = "no candidate kept a request within the SLO at any load: the SLO, the load or "
        return Decision(track, None, why + "the hardware must change first", [], [], lost)
    alive = some
    won = beats(result, alive)
    beaten = {n: [b for b in won if b.loser == n] for n in alive}
    fewest = min(len(v) for v in beaten.values())
    front = [n for n in alive if len(beaten[n]) == fewest]
    for name in alive:
        if name not in front:
            lost[name] = [
                f"less goodput within SLO than {b.winner} at {b.level:g} in every round "
                f"({b.winner}/{name}: " + ", ".join(f"{r:.2f}" for r in b.ratios) + ")"
                for b in beaten[name]
            ]
    if len(front) == 1:
        why = (
            "the only candidate no other beat on goodput within SLO at any load"
            if fewest == 0
            else f"beaten at the fewest loads ({fewest})"
        )
        return Decision(track, front[0], why, front, won, lost)

    def rank(name: str) -> tuple[int, int, float]:
        op = operability_of(name, operability)
        return (
            len(op.faults()) if op else 0,
            len(exit_faults(exit_cost_of(name, exit_cost))),
            -_top_median(by_name[name]),
        )

    ordered = sorted(front, key=rank)
    choice = ordered[0]
    best = rank(choice)
    tie = (
        f"tied on goodput within SLO ({', '.join(front)}: no decided difference)"
        if fewest == 0
        else f"{', '.join(front)} each beaten at {fewest} load(s): none ahead at every load"
    )
    for name in ordered[1:]:
        mine = rank(name)
        op = operability_of(name, operability)
        if mine[0] > best[0]:
            reason = "more operability faults: " + "; ".join(op.faults() if op else [])
        elif mine[1] > best[1]:
            reason = "more exit-cost failures: " + ", ".join(
                exit_faults(exit_cost_of(name, exit_cost))
            )
        elif mine == best:
            reason = "no difference in operability, exit cost or median goodput: taken first"
        else:
            reason = (
                f"lower median goodput at the heaviest load ({-mine[2]:.2f} vs {-best[2]:.2f} "
                "req/s, within the rounds' spread: not a verdict)"
            )
        lost[name] = [f"{tie}; {reason}"]
    keys = ("operability", "exit cost", "median goodput at the heaviest load")
    differs = [i for i in range(3) if any(rank(n)[i] != best[i] for n in ordered[1:])]
    decider = keys[differs[0]] if differs else "order in the run (no difference at all)"
    return Decision(track, choice, f"{tie}; chosen on {decider}", front, won, lost)
