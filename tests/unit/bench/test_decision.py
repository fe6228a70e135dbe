"""The decision record's logic on recorded results: who beats whom, ties, the record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from tests.unit.bench.helpers import smoke_run
from tritonforge.bench.__main__ import main
from tritonforge.bench.contract import load_contract
from tritonforge.bench.decision import choice, record
from tritonforge.bench.decision.operability import FORMAT, Candidate, OperabilityFile
from tritonforge.bench.exit_cost.results import CheckResult, SuiteResult
from tritonforge.bench.metrics import LevelMetrics, Percentiles
from tritonforge.bench.results import RunResult, TargetResult
from tritonforge.paths import REPO_ROOT


def lv(level: float, round_: int, goodput: float, slo_met: bool = True) -> LevelMetrics:
    return LevelMetrics(
        level=level,
        round=round_,
        requests=8,
        errors=0,
        error_share=0.0,
        duration_s=10.0,
        ttft_ms=Percentiles(p95=100.0),
        tpot_ms=Percentiles(p95=10.0),
        itl_ms=Percentiles(),
        e2e_ms=Percentiles(),
        output_tokens=100,
        output_tok_s=10.0,
        requests_s=1.0,
        goodput_rps=goodput,
        goodput_share=1.0,
        slo_met=slo_met,
    )


def target(name: str, by_level: dict[float, list[float]], **fields) -> TargetResult:
    levels = [lv(level, r, g) for level, gs in by_level.items() for r, g in enumerate(gs)]
    return TargetResult(
        name=name, kind="triton", tool="aiperf", status="ok", levels=levels, **fields
    )


def run(*targets: TargetResult, **fields) -> RunResult:
    contract, digest = load_contract(REPO_ROOT / "perf" / "contracts" / "smoke.yaml")
    result = smoke_run(contract, digest, list(targets), comparisons=[], rounds=3)
    return result.model_copy(update=fields)


def operability(name: str, **fields) -> Candidate:
    return Candidate(candidate=name, runtime=f"{name} 1.0", status="measured", **fields)


def suite(name: str, statuses: dict[str, str]) -> SuiteResult:
    checks = [CheckResult(check=c, status=s, summary=s) for c, s in statuses.items()]  # type: ignore[arg-type]
    return SuiteResult(
        candidate=name, base_url="u", model="m", started_at="s", finished_at="f", checks=checks
    )


def test_a_candidate_ahead_in_every_round_at_every_load_is_chosen() -> None:
    result = run(
        target("a", {1: [2.0, 2.1, 2.2], 8: [5.0, 5.5, 5.2]}),
        target("b", {1: [1.0, 1.1, 1.0], 8: [4.0, 4.1, 4.2]}),
    )
    decision = choice.decide(result, "cpu", [], [])
    assert decision.choice == "a" and decision.front == ["a"]
    assert [(b.winner, b.loser, b.level) for b in decision.beats] == [("a", "b", 1), ("a", "b", 8)]
    assert "less goodput within SLO than a at 1" in decision.lost["b"][0]


def test_rounds_that_straddle_decide_nothing_and_operability_breaks_the_tie() -> None:
    result = run(
        target("a", {8: [5.0, 4.0, 5.0]}),  # a ahead in two rounds, behind in one
        target("b", {8: [4.5, 4.5, 4.5]}),
    )
    hung = operability("a", failure={"killed": "engine", "in_flight": 4, "errors": 0, "hung": 4})
    decision = choice.decide(result, "cpu", [hung, operability("b")], [])
    assert decision.beats == [] and sorted(decision.front) == ["a", "b"]
    assert decision.choice == "b"
    assert "chosen on operability" in decision.why
    assert "4 requests hung" in decision.lost["a"][0] and "tied" in decision.lost["a"][0]


def test_a_tie_with_equal_operability_falls_to_exit_cost() -> None:
    result = run(target("a", {8: [5.0, 4.0, 5.0]}), target("b", {8: [4.5, 4.5, 4.5]}))
    suites = [suite("a", {"stop_sequence": "passed"}), suite("b", {"stop_sequence": "failed"})]
    decision = choice.decide(result, "cpu", [], suites)
    assert decision.choice == "a" and "exit cost" in decision.why
    assert "stop_sequence failed" in decision.lost["b"][0]


def test_a_noisy_run_decides_no_goodput_difference() -> None:
    result = run(target("a", {8: [9.0, 9.0, 9.0]}), target("b", {8: [1.0, 1.0, 1.0]}), noisy=True)
    decision = choice.decide(result, "cpu", [], [])
    assert decision.beats == [] and sorted(decision.front) == ["a", "b"]
    assert "median goodput at the heaviest load" in decision.why  # said, not a verdict
    assert "not a verdict" in decision.lost["b"][0]


def test_a_target_that_did_not_interleave_is_no_candidate() -> None:
    offline = target("offline", {8: [9.0, 9.0, 9.0]}, interleaved=False)
    verdict = choice.head_to_head(run(), offline, target("b", {8: [1.0, 1.0, 1.0]}), 8)
    assert verdict.verdict == "not interleaved"
    decision = choice.decide(run(offline, target("b", {8: [1.0, 1.0, 1.0]})), "cpu", [], [])
    assert decision.choice == "b" and "not interleaved" in decision.lost["offline"][0]


def test_the_choice_can_be_among_some_targets_only() -> None:
    result = run(target("a", {1: [2.0, 2.0, 2.0]}), target("b", {1: [1.0, 1.0, 1.0]}))
    assert choice.decide(result, "cpu", [], [], only=["b"]).choice == "b"


def test_candidates_each_ahead_somewhere_are_a_tie_said_as_such() -> None:
    result = run(
        target("a", {1: [2.0, 2.0, 2.0], 8: [1.0, 1.0, 1.0]}),
        target("b", {1: [1.0, 1.0, 1.0], 8: [2.0, 2.0, 2.0]}),
    )
    decision = choice.decide(result, "cpu", [], [])
    assert sorted(decision.front) == ["a", "b"] and "each beaten at 1 load(s)" in decision.why


def test_a_failed_candidate_or_one_without_goodput_loses_on_that_alone() -> None:
    broken = TargetResult(
        name="c", kind="triton", tool="aiperf", status="failed", error="port in use\nmore"
    )
    result = run(target("a", {1: [0.0, 0.1, 0.0]}), target("b", {1: [0.0, 0.0, 0.0]}), broken)
    decision = choice.decide(result, "cpu", [], [])
    assert decision.lost["c"] == ["did not run: port in use"]
    assert decision.lost["b"] == ["no request within the SLO at any load"]
    assert decision.choice == "a"
    assert choice.ratio(0.0, 0.0) == 1.0  # two empty rounds are a tie, not a loss


def test_no_choice_when_no_candidate_kept_a_request_within_the_slo() -> None:
    result = run(target("a", {1: [0.0, 0.0, 0.0]}), target("b", {1: [0.0, 0.0, 0.0]}))
    decision = choice.decide(result, "cpu", [], [])
    assert decision.choice is None and "must change first" in decision.why
    assert set(decision.lost) == {"a", "b"}


def test_slo_verdict_per_level_is_the_benchs_judge_on_each_rounds_outcome() -> None:
    mixed = TargetResult(
        name="a",
        kind="triton",
        tool="aiperf",
        status="ok",
        levels=[lv(1, 0, 1.0, True), lv(1, 1, 1.0, False), lv(1, 2, 1.0, True)],
    )
    assert choice.slo_verdict(run(), mixed, 1) == "inconclusive"
    assert choice.slo_verdict(run(), target("b", {1: [1, 1, 1]}), 1) == "met"


def test_operability_faults_come_from_the_measurements_only() -> None:
    c = operability(
        "a",
        shutdown={"in_flight": 8, "completed": 6, "failed": 2, "exit_s": None},
        failure={"killed": "engine", "in_flight": 4, "errors": 4, "hung": 0, "recovered": False},
        observability={"queue": True, "kv_cache": False, "request_id": False},
    )
    assert c.faults() == [
        "SIGTERM failed 2 of 8 requests in flight",
        "did not exit on SIGTERM",
        "does not serve again by itself after its engine dies",
        "metrics do not show kv cache",
        "one request cannot be followed by its id",
    ]
    assert operability("b").faults() == []  # nothing measured: nothing claimed


def test_operability_file_refuses_unknown_keys_and_unexplained_statuses() -> None:
    base = {"format": FORMAT, "track": "cpu", "measured_at": "t", "candidates": []}
    with pytest.raises(ValidationError, match="instal"):
        OperabilityFile.model_validate(base | {"instal": {}})
    with pytest.raises(ValidationError, match="needs a reason"):
        Candidate(candidate="sglang", runtime="sglang", status="failed")


def test_the_record_has_every_section_and_keeps_tracks_apart(tmp_path: Path) -> None:
    result = run(
        target("a", {1: [2.0, 2.1, 2.2]}),
        target("b", {1: [1.0, 1.1, 1.0]}),
        overrides=["load.rounds=3"],
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "results.json").write_text(result.model_dump_json())
    files = {
        "cpu": [
            operability("a", upgrade={"pins": ["requirements/serve.lock"], "rollback": ["x"]}),
            Candidate(candidate="sglang", runtime="SGLang", status="failed", reason="no kernels"),
        ],
        "gpu": [
            Candidate(
                candidate="trt", runtime="TensorRT-LLM", status="not run here", reason="no GPU"
            )
        ],
    }
    paths = []
    for track, candidates in files.items():
        path = tmp_path / f"{track}.json"
        path.write_text(
            json.dumps(
                {
                    "format": FORMAT,
                    "track": track,
                    "measured_at": "t",
                    "candidates": [c.model_dump() for c in candidates],
                }
            )
        )
        paths.append(path)
    exit_dir = tmp_path / "exit"
    exit_dir.mkdir()
    for s in (suite("a", {"json_schema": "passed"}), suite("b", {"json_schema": "unsupported"})):
        (exit_dir / f"{s.candidate}.json").write_text(s.model_dump_json())
    argv = ["decide", "--track", "cpu", "--run", str(run_dir), "--exit-cost", str(exit_dir)]
    argv += [arg for path in paths for arg in ("--operability", str(path))]
    assert main([*argv, "--out", str(tmp_path / "cpu.md")]) == 0
    text = (tmp_path / "cpu.md").read_text()
    for heading in (
        "## Workload and SLO",
        "## Goodput within SLO",
        "## Operability",
        "## Exit cost",
        "## Choice",
        "## Operating cost accepted",
        "## Rollback",
        "## Re-evaluate when",
    ):
        assert heading in text
    assert "**a** — the only candidate" in text and "load.rounds=3" in text
    assert "| b | 1 | 2.00, 1.91, 2.20 | met |" in text  # a over b, round by round
    assert "- **sglang**: failed: no kernels" in text  # a candidate that never ran lost too
    assert "TensorRT-LLM" not in text  # the GPU candidate is in the GPU record only
    assert "json_schema unsupported" in text or "response_format json_schema unsupported" in text
    smoke = REPO_ROOT / "perf" / "contracts" / "smoke.yaml"
    gpu = record.render("gpu", None, files["gpu"], [], [], [], [], contract=smoke)
    assert "not run here: no GPU" in gpu and "No choice on the gpu track" in gpu
    assert "- **trt**: not run here: no GPU" in gpu and "not run on this track" in gpu
