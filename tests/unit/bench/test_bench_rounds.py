"""Interleaved rounds and noise: the order rotates, foreign CPU is measured, verdicts follow."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from tests.unit.bench.helpers import smoke_run
from tritonforge.bench import report
from tritonforge.bench.contract import Slo
from tritonforge.bench.metrics import MeasuredRequest, summarize
from tritonforge.bench.noise import CpuSnapshot, NoiseSample, foreign_share, snapshot
from tritonforge.bench.results import ComparisonResult, RunResult, Spread, TargetResult
from tritonforge.bench.run_plan import rotated

SLO = Slo(ttft_p95_ms=1000, tpot_p95_ms=100, error_budget=0.0)


def test_each_round_starts_with_the_next_target() -> None:
    targets = ["a", "b", "c"]
    assert [rotated(targets, r) for r in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]
    # Over three rounds every target runs once in every position.
    assert {tuple(rotated(targets, r)[0] for r in range(3))} == {("a", "b", "c")}


def test_foreign_share_is_machine_busy_time_minus_the_runs_own() -> None:
    before = CpuSnapshot(at=0.0, busy_s=10.0, ours_s=4.0)
    after = CpuSnapshot(at=10.0, busy_s=22.0, ours_s=14.0)  # 12 s busy, 10 s of it ours
    assert foreign_share(before, after, cores=2) == 0.1  # 2 s of 20 core-seconds
    quiet = CpuSnapshot(at=10.0, busy_s=20.0, ours_s=14.5)  # ours ran past a tick: clamp
    assert foreign_share(before, quiet, cores=2) == 0.0


def test_a_busy_child_of_the_run_is_ours_not_foreign() -> None:
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass"
    start = snapshot()
    child = subprocess.Popen([sys.executable, "-c", burn])
    try:
        while child.poll() is None:
            time.sleep(0.05)
    finally:
        child.wait()
    end = snapshot()
    assert end.ours_s - start.ours_s >= 0.5  # reaped: counted in our children_* times
    assert psutil.Process().pid not in end.foreign


def noisy_sample(share: float) -> NoiseSample:
    return NoiseSample(
        load_1m_before=12.0,
        load_1m_after=14.0,
        foreign_cpu_share_before=share,
        foreign_cpu_share_during=share,
        foreign_top=["python (4242): 9.0 cpu s"],
    )


def run_result(noisy: bool) -> RunResult:
    from tritonforge.bench.contract import load_contract
    from tritonforge.launch.launcher import REPO_ROOT

    contract, digest = load_contract(REPO_ROOT / "perf" / "contracts" / "smoke.yaml")
    levels = []
    for r in range(3):
        records = [MeasuredRequest(0, 0, 100_000_000, True, 8, 20.0, [10.0] * 7, None, 8)]
        m = summarize(1, records, SLO)
        m.round, m.noise = r, noisy_sample(0.4 if noisy and r == 1 else 0.01)
        levels.append(m)
    ratio = Spread(median=0.99, min=0.97, max=1.02, rounds=3)
    verdict = "noisy" if noisy else "inconclusive"
    return smoke_run(
        contract,
        digest,
        [TargetResult(name="t", kind="triton", tool="aiperf", status="ok", levels=levels)],
        comparisons=[
            ComparisonResult(
                target="t",
                baseline="b",
                level=1,
                rounds=3,
                throughput_ratio=ratio,
                min_throughput_ratio=1.0,
                throughput_verdict=verdict,
            )
        ],
        rounds=3,
        max_foreign_cpu_share=0.1,
        noisy=noisy,
        noisiest_round="t at 1 round 2: 40.0% of the machine used by other processes",
    )


def test_a_noisy_run_reports_no_verdict_and_says_why() -> None:
    text = report.render(run_result(noisy=True), [])
    assert "**NOISY — no verdicts.**" in text
    assert "verdicts are withheld" in text
    assert "| no verdict (noisy) |" in text
    assert "| met |" not in text and "**missed**" not in text
    assert "python (4242): 9.0 cpu s" in text  # who was busy is named
    assert "0.990 (0.970–1.020)" in text  # the spread, not one number


def test_a_quiet_run_shows_medians_ranges_and_arrived_tokens() -> None:
    text = report.render(run_result(noisy=False), [])
    assert "Quiet enough for verdicts" in text
    assert "| inconclusive |" in text
    # One row per level: 3 rounds, tokens that arrived of those forced, errors/short.
    assert "| 1 | 3 | 80.0 (80.0–80.0) | 24 of 24 |" in text
    assert "| 0 / 0 / 3 | 3/3 |" in text


def test_every_round_and_target_gets_its_own_words_at_the_same_lengths(tmp_path) -> None:
    from tritonforge.bench.contract import load_contract
    from tritonforge.bench.run_plan import LevelLoad, RunPlan
    from tritonforge.bench.workload import PromptBuilder, build_workload
    from tritonforge.launch.launcher import REPO_ROOT

    contract, digest = load_contract(REPO_ROOT / "perf" / "contracts" / "smoke.yaml")
    words = [f" w{chr(97 + i)}{chr(97 + j)}x" for i in range(26) for j in range(26)]
    builder = PromptBuilder(words, lambda text: text.split())  # one token per word
    base = build_workload(contract, builder, 6, stream=1)
    load = LevelLoad(4, base, tmp_path / "t.jsonl", tmp_path / "w.json", stream=1)
    plan = RunPlan(contract, tmp_path, digest, [], tmp_path, tmp_path, tmp_path, [load], None)
    plan.builder = builder
    loads = [plan.round_load(load, r, t) for r in range(2) for t in ("a", "b")]
    shapes = {
        tuple((q.request_class, q.input_tokens, q.output_tokens) for q in x.requests) for x in loads
    }
    assert shapes == {tuple((q.request_class, q.input_tokens, q.output_tokens) for q in base)}
    prompts = [q.prompt for x in loads for q in x.requests]
    assert len(set(prompts)) == len(prompts)  # no prompt is ever sent twice
    assert all(x.trace.is_file() and x.workload.is_file() for x in loads)


def test_a_checkpoint_is_a_readable_run_marked_not_finished(tmp_path) -> None:
    import json

    from tritonforge.bench.contract import load_contract
    from tritonforge.bench.output import write_results
    from tritonforge.bench.run_plan import RunPlan
    from tritonforge.launch.launcher import REPO_ROOT

    path = REPO_ROOT / "perf" / "contracts" / "smoke.yaml"
    contract, digest = load_contract(path)
    plan = RunPlan(contract, path, digest, [], tmp_path, tmp_path, tmp_path, [], None)
    done = run_result(noisy=False)
    write_results(plan, done.targets, done.environment, "start", None)
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["finished_at"].startswith("not finished")
    assert [t["name"] for t in saved["targets"]] == ["t"]  # only what was measured
    assert saved["comparisons"] == []  # its comparisons name targets not measured yet
    assert "# Benchmark report" in (tmp_path / "report.md").read_text()


def test_a_noisy_round_is_measured_again_with_prompts_of_its_own(tmp_path) -> None:
    from types import SimpleNamespace

    from tritonforge.bench.contract import load_contract
    from tritonforge.bench.runner import Runner
    from tritonforge.launch.launcher import REPO_ROOT

    contract, _ = load_contract(REPO_ROOT / "perf" / "contracts" / "smoke.yaml")
    assert contract.load.noisy_round_retries == 1 and contract.load.max_foreign_cpu_share == 0.1
    plan = SimpleNamespace(contract=contract, levels=[SimpleNamespace(level=1.0)])
    runner = Runner.__new__(Runner)  # no progress bar, no servers: only the retry logic
    runner.plan, runner.say = plan, lambda _text: None
    result = TargetResult(name="t", kind="triton", tool="aiperf", status="ok")
    shares = iter([0.4, 0.05, 0.3, 0.6])
    attempts: list[int] = []

    def measure(_service, _target, load, round_, target_result, attempt=0) -> None:
        attempts.append(attempt)
        records = [MeasuredRequest(0, 0, 100_000_000, True, 8, 20.0, [10.0] * 7, None, 8)]
        m = summarize(load.level, records, SLO)
        m.round, m.noise = round_, noisy_sample(next(shares))
        target_result.levels.append(m)

    runner.measure = measure
    target = SimpleNamespace(name="t")
    runner.measure_quietly(None, target, plan.levels[0], 0, result)  # noisy, then quiet
    assert attempts == [0, 1]
    assert [m.noise.foreign_cpu_share_during for m in result.levels] == [0.05]
    assert [m.noise.foreign_cpu_share_during for m in result.discarded_rounds] == [0.4]
    runner.measure_quietly(None, target, plan.levels[0], 1, result)  # noisy twice: kept
    assert attempts == [0, 1, 0, 1]
    assert [m.noise.foreign_cpu_share_during for m in result.levels] == [0.05, 0.6]
    assert len(result.discarded_rounds) == 2
    # A tool that fails once is run once more; the failure becomes a note.
    from tritonforge.bench.results import LevelFailure

    def fail_then_measure(service, target_, load, round_, target_result, attempt=0) -> None:
        if attempt == 0:
            key = f"{load.level:g} round {round_ + 1}"
            target_result.failed_levels[key] = LevelFailure(error="export unreadable")
            return
        measure(service, target_, load, round_, target_result, attempt)

    runner.measure, shares, attempts[:] = fail_then_measure, iter([0.02]), []
    runner.measure_quietly(None, target, plan.levels[0], 2, result)
    assert attempts == [1] and result.failed_levels == {}
    assert [m.round for m in result.levels] == [0, 1, 2]
    assert result.notes == ["1 round 3: the tool failed (export unreadable); measured again"]
    done = run_result(noisy=False)
    assert "discarded" not in report.render(done, [])  # nothing discarded, nothing said
    done.targets[0].discarded_rounds = result.discarded_rounds[:1]
    assert "| 1 | 1 (discarded, measured again) | 40% / 40% |" in report.render(done, [])


def test_a_class_too_short_for_its_instruction_is_named() -> None:
    import pytest

    from tritonforge.bench.contract import load_contract
    from tritonforge.bench.workload import PromptBuilder, build_workload
    from tritonforge.launch.launcher import REPO_ROOT

    short = ["traffic.classes.1.input_tokens={dist: fixed, value: 20}"]
    contract, _ = load_contract(REPO_ROOT / "perf" / "contracts" / "smoke.yaml", short)
    words = [f" w{chr(97 + i)}{chr(97 + j)}x" for i in range(26) for j in range(26)]
    builder = PromptBuilder(words, lambda text: text.split())  # one token per word
    named = r"traffic class 'structured_output': input_tokens: .* than the 20 drawn"
    with pytest.raises(ValueError, match=named):
        build_workload(contract, builder, 40)


def test_one_noise_rule_a_share_above_the_bound_is_noisy() -> None:
    from tritonforge.bench.noise import MAX_FOREIGN_CPU_SHARE, all_quiet, is_noisy

    assert not is_noisy(MAX_FOREIGN_CPU_SHARE) and is_noisy(MAX_FOREIGN_CPU_SHARE + 0.01)
    assert all_quiet([0.0, 0.05]) and not all_quiet([0.0, 0.2]) and all_quiet([])
    assert is_noisy(0.06, bound=0.05)
