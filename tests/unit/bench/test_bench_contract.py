"""Contracts: the shipped ones are valid, and an invalid one is refused naming its field."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from tests.unit.bench.helpers import contract_refusal
from tritonforge.bench.ceiling import is_ceiling_contract, load_ceiling_contract
from tritonforge.bench.contract import ContractError, apply_overrides, load_contract, parse_contract

CONTRACTS = Path(__file__).resolve().parents[3] / "perf" / "contracts"


def smoke_data() -> dict:
    return yaml.safe_load((CONTRACTS / "smoke.yaml").read_text())


#: Contracts the serving-ceiling runner reads (``kind: ceiling``), checked below.
CEILING_CONTRACTS = {p.name for p in CONTRACTS.glob("*.yaml") if is_ceiling_contract(p)}


@pytest.mark.parametrize(
    "name", sorted(p.name for p in CONTRACTS.glob("*.yaml") if p.name not in CEILING_CONTRACTS)
)
def test_shipped_contracts_are_valid(name: str) -> None:
    contract, digest = load_contract(CONTRACTS / name)
    assert contract.targets and len(digest) == 64
    assert "triton" in {t.kind.value for t in contract.targets}  # each measures Triton


@pytest.mark.parametrize("name", sorted(CEILING_CONTRACTS))
def test_shipped_ceiling_contracts_are_valid(name: str) -> None:
    contract = load_ceiling_contract(CONTRACTS / name)
    assert contract.targets


def test_the_glob_finds_the_shipped_contracts() -> None:
    """The parametrized checks above must not silently run on nothing."""
    assert {"smoke.yaml", "chat-mix.yaml", "engines.yaml", "openai.yaml"} <= {
        p.name for p in CONTRACTS.glob("*.yaml")
    }
    assert {"serving-ceiling.yaml", "vllm-settings.yaml", "llamacpp-batching.yaml"} <= (
        CEILING_CONTRACTS
    )


def test_pipelines_judges_each_ensemble_by_its_share_of_the_direct_ttft() -> None:
    contract, _ = load_contract(CONTRACTS / "pipelines.yaml")
    models = {t.name: t.model for t in contract.targets}
    assert models == {
        "direct": "vllm_model",
        "ensemble-cpp": "ensemble_vllm",
        "ensemble-py": "ensemble_vllm_py",
    }
    assert {t.tool for t in contract.targets} == {"perf_analyzer"}  # one client for all
    assert {(c.target, c.baseline, c.max_ttft_p50_ratio) for c in contract.comparisons} == {
        ("ensemble-cpp", "direct", 1.05),
        ("ensemble-py", "direct", 1.05),
    }


def test_chat_mix_covers_the_issues_load_levels_and_mix() -> None:
    contract, _ = load_contract(CONTRACTS / "chat-mix.yaml")
    assert contract.load.concurrency == [1, 8, 32]
    shares = {c.name: c.share for c in contract.traffic.classes}
    assert shares == {"short_chat": 0.6, "long_document": 0.3, "structured_output": 0.1}


def refused(mutate) -> str:
    return contract_refusal(smoke_data(), mutate)


def test_a_misspelt_key_is_named() -> None:
    message = refused(lambda d: d["slo"].update(ttft_p59_ms=5))
    assert "slo.ttft_p59_ms" in message


def test_a_negative_slo_is_named() -> None:
    assert "slo.tpot_p95_ms" in refused(lambda d: d["slo"].update(tpot_p95_ms=-1))


def test_shares_that_do_not_add_up_are_named() -> None:
    message = refused(lambda d: d["traffic"]["classes"][0].update(share=0.5))
    assert "traffic" in message and "add up to 1.0" in message


def test_a_bad_distribution_field_is_named_by_its_yaml_path() -> None:
    def mutate(d: dict) -> None:
        d["traffic"]["classes"][1]["input_tokens"] = {"dist": "uniform", "min": 80, "max": 40}

    message = refused(mutate)
    assert "traffic.classes.1.input_tokens" in message and "max must be >= min" in message


def test_an_unknown_distribution_is_named() -> None:
    message = refused(lambda d: d["traffic"]["classes"][0].update(output_tokens={"dist": "zipf"}))
    assert "traffic.classes.0.output_tokens" in message


def test_a_prefix_longer_than_the_shortest_prompt_is_refused() -> None:
    message = refused(lambda d: d["traffic"]["shared_prefix"].update(tokens=500))
    assert "shared_prefix.tokens" in message


def test_both_or_neither_load_mode_is_refused() -> None:
    assert "exactly one of concurrency or request_rates" in refused(
        lambda d: d["load"].update(request_rates=[1.0])
    )
    assert "load" in refused(lambda d: d["load"].pop("concurrency"))


def test_a_triton_target_without_model_is_named() -> None:
    message = refused(lambda d: d["targets"][0].pop("model"))
    assert "targets.0" in message and "needs model" in message


def test_an_unknown_target_kind_is_named() -> None:
    assert "targets.1.kind" in refused(lambda d: d["targets"][1].update(kind="tgi"))


def test_a_comparison_with_an_unknown_target_is_named() -> None:
    message = refused(lambda d: d["comparisons"][0].update(baseline="nobody"))
    assert "comparisons.0.baseline" in message and "nobody" in message


def test_every_error_is_listed_not_only_the_first() -> None:
    def mutate(d: dict) -> None:
        d["slo"]["error_budget"] = 2
        d["load"]["requests_per_level"] = 0

    message = refused(mutate)
    assert "slo.error_budget" in message and "load.requests_per_level" in message


def test_overrides_change_the_contract_before_validation(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text((CONTRACTS / "smoke.yaml").read_text())
    contract, _ = load_contract(
        path, ["load.requests_per_level=2", "load.concurrency=[1, 2]", "targets.0.model=other"]
    )
    assert contract.load.requests_per_level == 2
    assert contract.load.concurrency == [1, 2]
    assert contract.targets[0].model == "other"


def test_an_override_that_breaks_the_contract_is_named(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text((CONTRACTS / "smoke.yaml").read_text())
    with pytest.raises(ContractError, match=r"load\.warmup_requests"):
        load_contract(path, ["load.warmup_requests=-3"])
    with pytest.raises(ContractError, match=r"dotted\.path=value"):
        apply_overrides({}, ["no-equals-sign"])


def test_a_file_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(ContractError, match="mapping"):
        load_contract(path)


def test_perf_analyzer_on_an_openai_server_needs_chat_and_never_drives_the_offline_engine() -> None:
    # Its OpenAI client speaks only /v1/chat/completions: a text target would be refused
    # by the tool mid-run, so the contract refuses it first, naming the rule.
    message = refused(lambda d: d["targets"][2].update(tool="perf_analyzer"))
    assert "targets.2" in message and "chat: true" in message
    message = refused(lambda d: d["targets"][3].update(tool="perf_analyzer"))
    assert "targets.3" in message and "offline engine" in message
    data = copy.deepcopy(smoke_data())
    data["targets"][2].update(tool="perf_analyzer", chat=True)
    assert parse_contract(data, "test.yaml").targets[2].tool == "perf_analyzer"


def test_the_offline_engine_is_refused_for_request_rates() -> None:
    # The offline engine has no arrivals to pace (perf_analyzer: test_bench_openloop.py).
    def mutate(d: dict) -> None:
        d["load"].pop("concurrency")
        d["load"]["request_rates"] = [0.5]
        d["targets"].pop(1)  # the perf_analyzer target

    message = refused(mutate)
    assert "targets.2.kind" in message and "vllm-offline" in message
    assert "concurrency levels only" in message


def test_a_level_that_can_never_fill_its_concurrency_is_refused() -> None:
    message = refused(lambda d: d["load"].update(requests_per_level=3))
    assert "load" in message and "concurrency 4 never fills with 3 requests" in message


def test_requests_per_concurrency_scales_the_high_levels() -> None:
    contract, _ = load_contract(CONTRACTS / "chat-mix.yaml")
    assert [contract.load.count_for(lv) for lv in contract.load.levels] == [24, 24, 64]


def test_the_openai_contract_matches_issue_12s_benchmark() -> None:
    contract, _ = load_contract(CONTRACTS / "openai.yaml")
    assert contract.load.concurrency == [1, 8, 32] and contract.load.rounds >= 3
    kinds = {t.name: (t.kind.value, t.tool, t.chat) for t in contract.targets}
    assert kinds == {
        # One client (perf_analyzer) on every side, so a TTFT gap is the servers'.
        "openai-frontend": ("openai", "perf_analyzer", True),
        "triton-grpc": ("triton", "perf_analyzer", True),
        "vllm-openai": ("vllm_openai", "perf_analyzer", True),
    }
    assert contract.sampling.ignore_eos and contract.sampling.temperature == 0
    (cls,) = contract.traffic.classes
    # Sized for a 2-core AVX2 machine (see the contract's header): short prompts, 32 tokens.
    assert (cls.input_tokens.bounds(), cls.output_tokens.bounds()) == ((50, 50), (32, 32))
    thresholds = {(c.target, c.baseline): c for c in contract.comparisons}
    direct = thresholds["openai-frontend", "triton-grpc"]
    assert (direct.min_throughput_ratio, direct.max_ttft_p50_delta_ms) == (0.97, 5)
    assert thresholds["openai-frontend", "vllm-openai"].min_throughput_ratio == 1.0
    triton = thresholds["triton-grpc", "vllm-openai"]  # Triton vs vLLM's server, one client
    assert (triton.min_throughput_ratio, triton.max_ttft_p50_delta_ms) == (1.0, 3)


def test_an_openai_target_needs_a_triton_model_and_chat_needs_a_chat_capable_path() -> None:
    message = refused(lambda d: d["targets"][0].update(kind="openai", model=None))
    assert "targets.0" in message and "openai target needs model" in message
    # aiperf's generate_stream template sends text: chat there would be a silent lie.
    message = refused(lambda d: d["targets"][0].update(chat=True))
    assert "targets.0" in message and "perf_analyzer" in message
    message = refused(lambda d: d["targets"][3].update(chat=True))
    assert "targets.3" in message and "offline engine" in message


def test_rounds_default_to_three_and_noise_has_a_bound() -> None:
    contract, _ = load_contract(CONTRACTS / "smoke.yaml")
    assert contract.load.rounds == 3 and 0 < contract.load.max_foreign_cpu_share <= 0.25
    assert "load.rounds" in refused(lambda d: d["load"].update(rounds=0))
