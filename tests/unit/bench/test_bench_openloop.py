"""Open-loop load: request-rate contracts, offered vs achieved rates, the saturation rule,
the sweep stopping at a saturated target, and the report's capacity section."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.unit.bench.helpers import contract_refusal
from tritonforge.bench import report, saturation
from tritonforge.bench.contract import (
    Saturation,
    Slo,
    load_contract,
    parse_contract,
)
from tritonforge.bench.metrics import LevelMetrics, MeasuredRequest, summarize
from tritonforge.bench.results import LevelFailure, TargetResult

CONTRACTS = Path(__file__).resolve().parents[3] / "perf" / "contracts"
SLO = Slo(ttft_p95_ms=1000, tpot_p95_ms=1000, error_budget=0.0)
RULE = Saturation(min_goodput_share=0.9, min_achieved_ratio=0.9)


def capacity_data() -> dict:
    return yaml.safe_load((CONTRACTS / "capacity.yaml").read_text())


def refused(mutate) -> str:
    return contract_refusal(capacity_data(), mutate)


# --- the contract ------------------------------------------------------------------------


def test_the_capacity_contract_sweeps_rates_on_triton_and_vllms_server() -> None:
    contract, _ = load_contract(CONTRACTS / "capacity.yaml")
    assert contract.load.mode == "request_rate" and contract.load.sweep
    assert contract.load.levels == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert contract.load.saturation_rule == RULE
    tools = {t.name: (t.kind.value, t.tool) for t in contract.targets}
    assert tools == {
        "triton-http": ("triton", "aiperf"),
        "vllm-openai": ("vllm_openai", "aiperf"),
    }
    assert contract.load.rounds >= 3


def test_a_factor_sweep_multiplies_and_a_step_sweep_adds() -> None:
    data = capacity_data()
    data["load"]["request_rates"] = {"sweep": {"start": 0.5, "factor": 2, "max": 5}}
    assert parse_contract(data).load.levels == [0.5, 1.0, 2.0, 4.0]
    data["load"]["request_rates"] = {"sweep": {"start": 0.1, "step": 0.1, "max": 0.5}}
    assert parse_contract(data).load.levels == [0.1, 0.2, 0.3, 0.4, 0.5]  # no float drift
    data["load"]["request_rates"] = [0.5, 1.5]
    contract = parse_contract(data)
    assert contract.load.levels == [0.5, 1.5] and not contract.load.sweep
    assert contract.load.saturation_rule == RULE  # a plain list of rates is judged too


@pytest.mark.parametrize(
    ("sweep", "says"),
    [
        ({"start": 1, "max": 4}, "exactly one of factor or step"),
        ({"start": 1, "step": 1, "factor": 2, "max": 4}, "exactly one of factor or step"),
        ({"start": 4, "step": 1, "max": 1}, "max must be >= start"),
        ({"start": 1, "step": 0.1, "max": 10}, "at most 12"),
        ({"start": 1, "factor": 1, "max": 4}, "greater than 1"),
    ],
)
def test_a_malformed_sweep_is_refused_by_its_path(sweep: dict, says: str) -> None:
    message = refused(lambda d: d["load"].update(request_rates={"sweep": sweep}))
    assert "load.request_rates" in message and says in message


def test_saturation_is_refused_on_concurrency_levels() -> None:
    def mutate(d: dict) -> None:
        d["load"].pop("request_rates")
        d["load"]["concurrency"] = [1, 4]

    message = refused(mutate)
    assert "load: saturation applies to request_rates" in message


def test_a_rate_level_needs_two_requests_to_have_a_rate() -> None:
    message = refused(lambda d: d["load"].update(requests_per_level=1))
    assert "load: a request rate needs requests_per_level >= 2" in message


def test_the_offline_engine_is_refused_at_a_request_rate_naming_the_target() -> None:
    def mutate(d: dict) -> None:
        d["targets"].append(
            {"name": "offline", "kind": "vllm_offline", "engine_config": "model.json"}
        )

    message = refused(mutate)
    assert "targets.2.kind" in message and "offline" in message
    assert "concurrency levels only" in message


def test_perf_analyzer_is_refused_at_a_request_rate_naming_the_target() -> None:
    def mutate(d: dict) -> None:
        d["targets"][0]["tool"] = "perf_analyzer"

    message = refused(mutate)
    assert "targets.0.tool" in message and "triton-http" in message
    assert "concurrency levels only" in message and "use tool: aiperf" in message


# --- offered vs achieved -----------------------------------------------------------------

S = 1_000_000_000


def request(i: int, start_s: float, end_s: float, **kw) -> MeasuredRequest:
    kw.setdefault("ttft_ms", 100.0)
    kw.setdefault("output_tokens", 8)
    kw.setdefault("expected_tokens", 8)
    return MeasuredRequest(i, int(start_s * S), int(end_s * S), kw.pop("ok", True), **kw)


def round_at(
    rate: float,
    n: int = 10,
    keep_up: float = 1.0,
    late: int = 0,
    short: int = 0,
    latency_s: float = 0.5,
) -> list[MeasuredRequest]:
    """n arrivals at ``rate``; completions at ``keep_up`` x that rate; ``late`` miss TTFT.

    A request that ends later than its own ``latency_s`` waited in a queue: like on a
    real server, that wait is part of its time to first token.
    """
    out = []
    for i in range(n):
        start, end = i / rate, latency_s + i / (rate * keep_up)
        end = max(end, start + 0.2)
        queued_ms = max(0.0, end - start - latency_s) * 1000
        ttft = (5000.0 if i < late else 100.0) + queued_ms
        tokens = 3 if late <= i < late + short else 8
        out.append(request(i, start, end, ttft_ms=ttft, output_tokens=tokens))
    return out


@pytest.mark.parametrize("answers", ["together at the end", "spread out"])
def test_achieved_is_finished_requests_over_the_levels_wall_time(answers: str) -> None:
    """20 requests that took 89 s are ~0.22 req/s, however their completions spread."""
    records = [
        request(i, i / 0.71, 89 - i / 40 if answers == "together at the end" else 30 + i * 59 / 19)
        for i in range(20)
    ]
    m = summarize(1.0, records, SLO)
    assert max(r.end_ns for r in records) == 89 * S
    assert m.offered_rps == pytest.approx(0.71)
    assert m.achieved_rps == pytest.approx(20 / 89) and m.achieved_rps < 0.23


def test_a_short_level_that_keeps_up_reads_as_kept_up_despite_its_tail() -> None:
    m = summarize(2.0, round_at(2.0, n=10, latency_s=3.0), SLO)
    # Wall time 4.5 s of arrivals + the last request's own 3 s: 10 / 7.5 s.
    assert m.offered_rps == pytest.approx(2.0) and m.achieved_rps == pytest.approx(10 / 7.5)
    assert m.kept_up_rps == pytest.approx(m.achieved_rps)
    assert saturation.achieved_ratio(m) == pytest.approx(1.0)
    slow = summarize(2.0, round_at(2.0, n=10, keep_up=0.5), SLO)
    assert slow.achieved_rps == pytest.approx(10 / 9.5)  # the last answer at 9.5 s
    assert saturation.achieved_ratio(slow) == pytest.approx(5.0 / 9.5)  # queued: 5 s expected


def test_nothing_finished_is_a_rate_of_zero_and_no_kept_up_rate() -> None:
    records = [request(i, i, i + 1, ok=False, error="boom") for i in range(3)]
    m = summarize(1.0, records, SLO)
    assert m.achieved_rps == 0.0 and m.kept_up_rps is None
    assert saturation.achieved_ratio(m) is None


def test_a_request_the_tool_never_sent_is_not_an_arrival() -> None:
    records = round_at(1.0, n=4)
    records.append(MeasuredRequest(9, 100 * S, 100 * S, False, error="no record", sent=False))
    m = summarize(1.0, records, SLO)
    assert m.offered_rps == pytest.approx(1.0)  # not stretched to t = 100 s
    assert m.errors == 1 and m.goodput_share == pytest.approx(4 / 5)


# --- the saturation rule -----------------------------------------------------------------


def level(rate: float, round_: int, **shape) -> LevelMetrics:
    m = summarize(rate, round_at(rate, **shape), SLO)
    m.round = round_
    return m


def target_with(rounds: dict[float, list[dict]], name: str = "t") -> TargetResult:
    """rounds[rate] = one shape per round (see round_at)."""
    levels = [
        level(rate, r, **shape) for rate, shapes in rounds.items() for r, shape in enumerate(shapes)
    ]
    return TargetResult(name=name, kind="triton", tool="perf_analyzer", status="ok", levels=levels)


OK: dict = {}
SLOW = {"keep_up": 0.6}  # completions fall behind arrivals
LATE = {"late": 3}  # 3 of 10 past the TTFT bound: goodput share 0.7
SHORT = {"short": 2}  # 2 of 10 delivered fewer tokens than forced: share 0.8


def test_the_point_is_the_last_rate_that_held_before_one_that_broke() -> None:
    t = target_with({1: [OK] * 3, 2: [OK] * 3, 3: [SLOW, LATE, SLOW], 4: [SLOW] * 3})
    result = saturation.assess(t, RULE, rounds=3)
    assert (result.status, result.point, result.next_rate) == ("saturated", 2.0, 3.0)
    assert [lv.state for lv in result.levels] == ["held", "held", "broke", "broke"]
    assert result.caveat is None


def test_short_and_failed_requests_count_against_goodput() -> None:
    t = target_with({1: [OK] * 3, 2: [SHORT] * 3})
    result = saturation.assess(t, RULE, rounds=3)
    assert (result.status, result.point) == ("saturated", 1.0)
    assert result.levels[1].goodput_share.median == pytest.approx(0.8)
    assert result.levels[1].achieved_ratio.median == pytest.approx(1.0)  # kept up, yet broke


def test_rounds_that_disagree_make_the_point_inconclusive() -> None:
    t = target_with({1: [OK] * 3, 2: [OK, LATE, OK], 3: [SLOW] * 3})
    result = saturation.assess(t, RULE, rounds=3)
    assert (result.status, result.point, result.next_rate) == ("inconclusive", 1.0, 2.0)
    assert result.levels[1].held == 2 and result.levels[1].rounds == 3


def test_a_round_the_tool_could_not_complete_did_not_hold() -> None:
    t = target_with({1: [OK] * 3, 2: [OK, OK]})
    t.failed_levels["2 round 3"] = LevelFailure(error="perf_analyzer timed out")
    result = saturation.assess(t, RULE, rounds=3)
    assert result.levels[1].rounds == 3 and result.levels[1].state == "inconclusive"


def test_every_rate_held_or_the_first_broke() -> None:
    held = saturation.assess(target_with({1: [OK] * 3, 2: [OK] * 3}), RULE, rounds=3)
    assert (held.status, held.point, held.next_rate) == ("not reached", 2.0, None)
    low = saturation.assess(target_with({1: [SLOW] * 3, 2: [OK] * 3}), RULE, rounds=3)
    assert (low.status, low.point, low.next_rate) == ("below the lowest rate", None, 1.0)


def test_a_noisy_run_or_too_few_rounds_is_a_measurement_not_a_verdict() -> None:
    t = target_with({1: [OK] * 3, 2: [SLOW] * 3})
    assert "noisy" in (saturation.assess(t, RULE, rounds=3, noisy=True).caveat or "")
    one = target_with({1: [OK], 2: [SLOW]})
    assert "fewer than 3" in (saturation.assess(one, RULE, rounds=1).caveat or "")


# --- the sweep stops raising a saturated target ------------------------------------------


def test_a_sweep_stops_driving_a_target_once_a_rate_broke_in_every_round(tmp_path) -> None:
    from rich.console import Console

    from tritonforge.bench.run_plan import LevelLoad, RunPlan
    from tritonforge.bench.runner import Runner

    contract, digest = load_contract(CONTRACTS / "capacity.yaml")
    loads = [LevelLoad(rate, [], tmp_path / "t", tmp_path / "w") for rate in contract.load.levels]
    plan = RunPlan(contract, tmp_path, digest, [], tmp_path, tmp_path, tmp_path, loads, None)
    runner = Runner(plan, Console(file=open(Path(tmp_path) / "log", "w")))  # noqa: SIM115
    capacity = {"triton-http": 3.0, "vllm-openai": 1.0}  # req/s each keeps up with
    driven: list[tuple[str, float]] = []

    def measure(service, target, load, round_, result, attempt=0) -> None:
        driven.append((target.name, load.level))
        shape = OK if load.level <= capacity[target.name] else SLOW
        result.levels.append(level(load.level, round_, **shape))

    runner.measure = measure  # type: ignore[method-assign]
    results = {
        t.name: TargetResult(name=t.name, kind=t.kind.value, tool=t.tool, status="ok")
        for t in contract.targets
    }
    runner.run_rounds(dict.fromkeys(results), list(contract.targets), results)
    rates = {name: sorted({lv for n, lv in driven if n == name}) for name in results}
    assert rates == {"triton-http": [1.0, 2.0, 3.0, 4.0], "vllm-openai": [1.0, 2.0]}
    assert "sweep stopped after 2 req/s" in results["vllm-openai"].notes[0]


# --- the report ----------------------------------------------------------------------------


def capacity_run(noisy: bool = False):
    from tests.unit.bench.test_bench_rounds import run_result

    run = run_result(noisy=noisy)
    contract, digest = load_contract(CONTRACTS / "capacity.yaml")
    a = target_with({1: [OK] * 3, 2: [OK] * 3, 3: [SLOW] * 3}, "triton-http")
    b = target_with({1: [OK] * 3, 2: [OK, LATE, OK]}, "vllm-openai")
    return run.model_copy(
        update={
            "contract_name": contract.name,
            "contract_path": "perf/contracts/capacity.yaml",
            "contract_sha256": digest,
            "contract": contract.model_dump(mode="json", by_alias=True),
            "load_mode": "request_rate",
            "targets": [a, b],
            "comparisons": [],
            "saturation": [saturation.assess(t, RULE, 3, noisy=noisy) for t in (a, b)],
        }
    )


def test_the_report_gives_goodput_per_rate_and_each_targets_saturation_point() -> None:
    text = report.render(capacity_run(), [])
    assert "## Capacity (open loop, Poisson arrivals)" in text
    assert "request-rate sweep (1 +1 up to 5)" in text
    assert "| triton-http | **2 req/s** (broke at 3) | saturated | – |" in text
    assert "| vllm-openai | inconclusive: 1 req/s held, rounds disagree at 2 |" in text
    # rate, rounds held, offered, achieved, kept-up, ratio, goodput share, goodput req/s:
    # the last of 10 answers at 5.5 s where 3.5 s had nothing queued; half of them queued
    # past the TTFT bound
    assert (
        "| triton-http | 3 | 0/3 | 3.00 (3.00–3.00) | 1.82 (1.82–1.82) | 2.86 (2.86–2.86) "
        "| 0.64 (0.64–0.64) | 0.50 (0.50–0.50) | 0.91 (0.91–0.91) |" in text
    )
    assert "| vllm-openai | 2 | 2/3 | 2.00 (2.00–2.00) | 2.00 (2.00–2.00) |" in text
    assert "| 1.00 (0.70–1.00) | 2.00 (1.40–2.00) |" in text  # the LATE round: 7 of 10 good
    assert "points are measurements, not verdicts" not in text


def test_a_noisy_capacity_run_says_its_points_are_not_verdicts(tmp_path) -> None:
    run = capacity_run(noisy=True)
    text = report.render(run, [])
    assert "**This run was noisy: the points are measurements, not verdicts.**" in text
    assert "noisy run: a measurement, not a verdict |" in text
    report.write(run, tmp_path)
    assert (tmp_path / "goodput_vs_rate.png").stat().st_size > 0
    assert "![goodput_vs_rate](goodput_vs_rate.png)" in (tmp_path / "report.md").read_text()


def test_the_overload_driver_takes_s_and_the_peak_from_the_tools_sweep(tmp_path) -> None:
    from tritonforge.bench.overload import swept_saturation

    (tmp_path / "results.json").write_text(capacity_run().model_dump_json())
    rate, peak = swept_saturation(tmp_path)
    # triton-http, the contract's first target, held up to 2 req/s; its best median
    # goodput among the swept rates is what the overload targets are a share of
    assert rate == 2.0 and peak is not None and peak > 0
