"""A run's record: results.json and report.md, written after every level and at the end.

What is written is the targets as they stand — a checkpoint while the run goes on, the
result once it finished — with the judgements made from them: the noisiest round and
whether it made the run noisy, the comparisons and, for request rates, each target's
saturation point.
"""

from __future__ import annotations

from tritonforge.bench import saturation
from tritonforge.bench.contract import Contract
from tritonforge.bench.environment import Environment
from tritonforge.bench.noise import is_noisy
from tritonforge.bench.results import ComparisonResult, RunResult, TargetResult, compare
from tritonforge.bench.run_plan import RunPlan
from tritonforge.paths import REPO_ROOT


def noisiest_round(targets: list[TargetResult]) -> tuple[float, str] | None:
    """(foreign CPU share, where) of the round that saw the most, over interleaved targets."""
    return max(
        (
            (m.noise.foreign_cpu_share_during, f"{t.name} at {m.level:g} round {m.round + 1}")
            for t in targets
            if t.interleaved
            for m in t.levels
            if m.noise is not None
        ),
        default=None,
    )


def comparisons(
    contract: Contract, targets: list[TargetResult], noisy: bool
) -> list[ComparisonResult]:
    """The contract's comparisons whose two sides were both measured."""
    by_name = {t.name: t for t in targets}
    return [
        row
        for spec in contract.comparisons
        if spec.target in by_name and spec.baseline in by_name
        for row in compare(
            spec, by_name[spec.target], by_name[spec.baseline], contract.load.levels, noisy=noisy
        )
    ]


def shown_path(plan: RunPlan) -> str:
    """The contract's path relative to the repository, where it lies inside it."""
    try:
        return str(plan.contract_path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(plan.contract_path)


def write_results(
    plan: RunPlan,
    targets: list[TargetResult],
    environment: Environment,
    started: str,
    finished: str | None,
) -> RunResult:
    """results.json and report.md from the targets as they stand (a checkpoint if unfinished)."""
    from tritonforge.bench import report

    load = plan.contract.load
    noisiest = noisiest_round(targets)
    noisy = noisiest is not None and is_noisy(noisiest[0], load.max_foreign_cpu_share)
    rule = load.saturation_rule
    points = [
        saturation.assess(t, rule, load.rounds, noisy=noisy)
        for t in targets
        if rule is not None and (t.levels or t.failed_levels)
    ]
    result = RunResult(
        contract_name=plan.contract.name,
        contract_path=shown_path(plan),
        contract_sha256=plan.contract_sha256,
        overrides=plan.overrides,
        contract=plan.contract.model_dump(mode="json", by_alias=True),
        started_at=started,
        finished_at=finished or "not finished: checkpoint after the last completed level",
        load_mode=load.mode,
        environment=environment,
        targets=targets,
        comparisons=comparisons(plan.contract, targets, noisy),
        rounds=load.rounds,
        max_foreign_cpu_share=load.max_foreign_cpu_share,
        noisy=noisy,
        saturation=points,
        noisiest_round=None
        if noisiest is None
        else f"{noisiest[1]}: {noisiest[0]:.1%} of the machine used by other processes",
    )
    (plan.run_dir / "results.json").write_text(result.model_dump_json(indent=2) + "\n")
    report.write(result, plan.run_dir)
    return result
