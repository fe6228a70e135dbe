"""A ceiling contract's servers of their own and its comparisons, without a server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tritonforge.bench.ceiling import (
    RECEIVER_URL,
    ServerSetup,
    load_ceiling_contract,
    measuring_units,
    server_env,
    verdicts,
    wants_receiver,
)
from tritonforge.bench.ceiling_report import server_lines, verdict_lines
from tritonforge.bench.contract import ContractError

CONTRACT = Path(__file__).resolve().parents[3] / "perf" / "contracts" / "tracing-cost.yaml"


def test_the_tracing_cost_contract_gives_each_tracing_setting_a_server() -> None:
    contract = load_ceiling_contract(CONTRACT)
    by_name = {s.name: s for s in contract.servers}
    assert by_name["tracing-off"].env == {} == by_name["tracing-off-b"].env  # the pair
    assert by_name["tracing-1"].env["TRITONFORGE_TRACE_SAMPLING"] == "0.01"
    assert {t.server for t in contract.targets} == set(by_name)
    assert wants_receiver(contract.servers)
    assert {c.max_server_cpu_ratio for c in contract.comparisons} == {1.10, 1.02}


def test_a_contract_without_servers_has_the_one_default_server() -> None:
    path = CONTRACT.with_name("serving-ceiling.yaml")
    contract = load_ceiling_contract(path)
    assert [s.name for s in contract.servers] == ["default"]
    assert {t.server for t in contract.targets} == {"default"}
    assert not wants_receiver(contract.servers) and contract.comparisons == []


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("targets.0.server=nowhere", "target chat-off: server 'nowhere' is not in servers"),
        ("servers.1.name=tracing-off", "servers: names repeat"),
        ("comparisons.0.baseline=nobody", r"comparisons\.0: 'nobody' is not a target"),
        ("comparisons.1.concurrency=8", r"comparisons\.1: concurrency 8 is not a level"),
    ],
)
def test_an_inconsistent_contract_is_refused_naming_the_field(override: str, message: str) -> None:
    with pytest.raises(ContractError, match=message):
        load_ceiling_contract(CONTRACT, [override])


@pytest.mark.parametrize(
    ("together", "message"),
    [
        ("[[grpc-off, nobody]]", r"load\.together\.0: nobody not a target"),
        ("[[grpc-off, chat-off]]", r"load\.together\.0: targets share a server"),
        ("[[grpc-off, grpc-on-1], [grpc-on-1, chat-on-100]]", "in more than one group"),
    ],
)
def test_a_group_measured_together_needs_known_targets_on_servers_of_their_own(
    together: str, message: str
) -> None:
    with pytest.raises(ContractError, match=message):
        load_ceiling_contract(CONTRACT, [f"load.together={together}"])


def test_a_group_is_measured_at_once_in_its_first_targets_place() -> None:
    contract = load_ceiling_contract(
        CONTRACT, ["load.together=[[grpc-off, grpc-on-100, grpc-on-1], [chat-on-1, chat-off]]"]
    )
    units = [[t.name for t in unit] for unit in measuring_units(contract)]
    assert units == [
        ["chat-on-1", "chat-off"],
        ["chat-on-100"],
        ["grpc-off", "grpc-on-100", "grpc-on-1"],
        ["chat-off-b"],
        ["grpc-off-b"],
    ]
    alone = load_ceiling_contract(CONTRACT)
    assert [[t.name for t in unit] for unit in measuring_units(alone)] == [
        [t.name] for t in alone.targets
    ]


def test_a_server_no_target_runs_on_is_refused() -> None:
    spare = (
        "servers=[{name: tracing-off}, {name: tracing-off-b}, {name: tracing-100},"
        " {name: tracing-1}, {name: b}]"
    )
    with pytest.raises(ContractError, match="servers: b serve no target"):
        load_ceiling_contract(CONTRACT, [spare])


def test_the_receivers_url_goes_where_a_server_names_it() -> None:
    setup = ServerSetup(name="on", env={"TRITONFORGE_OTLP_ENDPOINT": RECEIVER_URL, "X": "1"})
    url = "http://127.0.0.1:5000/v1/traces"
    assert server_env(setup, url) == {"TRITONFORGE_OTLP_ENDPOINT": url, "X": "1"}
    with pytest.raises(ValueError, match="without a receiver"):
        server_env(setup, None)


def row(target: str, round_index: int, cpu: float, noisy: bool = False) -> dict[str, Any]:
    return {
        "target": target,
        "round": round_index,
        "concurrency": 64,
        "server_cpu_us_per_token": cpu,
        "tokens_per_s": 1000.0,
        "noisy": noisy,
    }


@pytest.mark.parametrize(
    ("traced", "verdict"),
    [
        ([10.5, 10.9, 10.0], "met"),  # every round within 1.10×
        ([11.5, 12.0, 11.2], "missed"),  # every round beyond it
        ([10.5, 11.5, 10.9], "inconclusive"),  # the rounds straddle it
        ([10.5, 10.9], "too few rounds"),
    ],
)
def test_a_comparison_is_judged_round_by_round(traced: list[float], verdict: str) -> None:
    contract = load_ceiling_contract(CONTRACT)
    rows = [row("chat-off", i, 10.0) for i in range(3)]
    rows += [row("chat-on-100", i, cpu) for i, cpu in enumerate(traced)]
    [judged, *others] = verdicts(contract, rows)
    assert judged["target"] == "chat-on-100" and judged["verdict"] == verdict
    assert judged["server_cpu_ratio_per_round"] == [round(c / 10.0, 4) for c in traced]
    assert all(o["server_cpu_ratio_per_round"] == [] for o in others)


def test_a_noisy_pair_gets_no_verdict_and_the_report_shows_it() -> None:
    contract = load_ceiling_contract(CONTRACT)
    rows = [row("chat-off", i, 10.0, noisy=i == 1) for i in range(3)]
    rows += [row("chat-on-100", i, 10.2) for i in range(3)]
    judged = verdicts(contract, rows)
    assert judged[0]["verdict"] == "noisy"
    lines = "\n".join(verdict_lines(judged) + server_lines(contract.model_dump()["servers"]))
    assert "| chat-on-100 ÷ chat-off | 64 | 1.020, 1.020, 1.020 | ≤ 1.1 | **noisy** |" in lines
    assert "tracing-100: `TRITONFORGE_OTLP_ENDPOINT=${OTLP_RECEIVER}`" in lines
