"""The overload contract's schema: multiples of a swept saturation rate, judged targets."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tritonforge.bench.contract import ContractError, load_contract, parse_contract
from tritonforge.bench.results import MIN_ROUNDS

OVERLOAD = Path(__file__).resolve().parents[3] / "perf" / "contracts" / "overload.yaml"


def data() -> dict:
    return yaml.safe_load(OVERLOAD.read_text())


def test_the_shipped_overload_contract_states_the_issue_targets() -> None:
    contract, _ = load_contract(OVERLOAD)
    overload = contract.overload
    assert overload is not None and contract.load.sweep
    assert overload.saturation_multiples == [0.5, 1, 1.5, 2, 3]
    # >= 10 measured minutes per rate and mode over the rounds, each cell warmed up 1 min
    assert overload.duration_s * overload.rounds >= 600 and overload.warmup_s >= 60
    assert overload.rounds >= MIN_ROUNDS
    targets = overload.targets
    assert (targets.at_multiple, targets.min_goodput_share_of_peak, targets.min_goodput_gain) == (
        2,
        0.8,
        3.0,
    )
    assert (targets.min_admitted_slo_share, targets.max_refusal_p99_ms) == (0.95, 50)
    assert targets.max_ttft_error_p50 == 0.2


def test_overload_needs_a_sweep_to_find_the_saturation_rate() -> None:
    raw = data()
    raw["load"]["request_rates"] = [1.0, 2.0]
    with pytest.raises(ContractError, match="overload: multiples of the saturation rate"):
        parse_contract(raw, "overload.yaml")


def test_the_judged_multiples_must_be_run() -> None:
    raw = data()
    raw["overload"]["saturation_multiples"] = [0.5, 1, 3]
    with pytest.raises(ContractError, match="must include 2"):
        parse_contract(raw, "overload.yaml")
