"""The metrics the Gateway API Inference Extension's endpoint picker reads, off the real server.

The picker (deploy/k8s/gateway/, pinned to the extension's v1.0.0) scrapes each replica's
metrics port and expects, per its model-server protocol: the queue (``num_requests_waiting``)
and the running requests as gauges, the KV-cache usage as a gauge in [0, 1], and for LoRA
affinity ``lora_requests_info``: a gauge whose labels ``running_lora_adapters`` and
``waiting_lora_adapters`` (comma-separated names) and ``max_lora`` describe the adapters and
whose value is when it was last set. Every LLM model on the session server is checked; the
live adapter check runs on the LoRA models' own server (tests/e2e/test_lora.py).
"""

from __future__ import annotations

import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.client import LONG_GREEDY, Hold, bytes_input, llm_inputs, model_ready, wait_for
from tests.unit.deploy.test_k8s_gateway import epp_metric_flags
from tritonforge.launch.launcher import TritonServer

LLM_MODELS = ("vllm_model", "vllm_lora_model")
LORA_MODEL = "vllm_lora_model"
LORA_LABELS = {"running_lora_adapters", "waiting_lora_adapters", "max_lora"}


def families(server: TritonServer) -> dict[str, object]:
    text = requests.get(server.metrics_url, timeout=10).text
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(sample: object) -> float:
    return float(sample.value)


def samples(server: TritonServer, name: str, model: str) -> list[object]:
    family = families(server)[name]
    return [s for s in family.samples if s.labels.get("model") == model]


@pytest.fixture(scope="module")
def loaded(triton_server: TritonServer) -> list[str]:
    models = [m for m in LLM_MODELS if model_ready(triton_server, m)]
    if not models:
        pytest.skip(f"none of {', '.join(LLM_MODELS)} is loaded on the session server")
    return models


def test_the_picker_is_told_the_names_the_server_exports() -> None:
    """The EPP's metric flags name series this test checks, each narrowed to one model."""
    flags = epp_metric_flags()
    names = {flag: spec.split("{")[0] for flag, spec in flags.items()}
    assert names == {
        "total-queued-requests-metric": "vllm:num_requests_waiting",
        "kv-cache-usage-percentage-metric": "vllm:kv_cache_usage_perc",
        "lora-info-metric": "vllm:lora_requests_info",
    }
    # One model per pool: every flag narrows its series to the same model label.
    assert len({spec.split("{", 1)[1] for spec in flags.values()}) == 1


def test_queue_running_and_kv_cache_are_gauges_per_model(triton_server, loaded) -> None:
    found = families(triton_server)
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running"):
        assert found[name].type == "gauge", name
    assert found["vllm:kv_cache_usage_perc"].type == "gauge"
    for model in loaded:
        for name in ("vllm:num_requests_waiting", "vllm:num_requests_running"):
            [sample] = samples(triton_server, name, model)
            assert sample.value >= 0 and sample.value == int(sample.value)
        [usage] = samples(triton_server, "vllm:kv_cache_usage_perc", model)
        assert 0.0 <= usage.value <= 1.0  # a fraction, as the picker compares it


def test_lora_info_is_one_fresh_gauge_with_the_adapter_labels(triton_server, loaded) -> None:
    assert families(triton_server)["vllm:lora_requests_info"].type == "gauge"
    for model in loaded:
        info = max(samples(triton_server, "vllm:lora_requests_info", model), key=value)
        assert info.labels.keys() >= LORA_LABELS
        # The value is when the labels were last set; the picker keeps the newest.
        assert abs(info.value - time.time()) < 30
        expected_max = "2" if model == LORA_MODEL else "0"  # model.json's max_loras
        assert info.labels["max_lora"] == expected_max
        assert info.labels["running_lora_adapters"] == ""  # idle


def adapter_shows_then_leaves(triton_server: TritonServer) -> None:
    """A request on smol-alpha shows in the newest lora_requests_info, then leaves it.

    Run by tests/e2e/test_lora.py on its own server, which serves ``vllm_lora_model``.
    """
    inputs = [*llm_inputs("Count slowly:", LONG_GREEDY), bytes_input("lora_name", "smol-alpha")]

    def adapters() -> set[str]:
        # As the picker reads it: the newest series (a former label set keeps its older time).
        info = max(samples(triton_server, "vllm:lora_requests_info", LORA_MODEL), key=value)
        named = info.labels["running_lora_adapters"] + "," + info.labels["waiting_lora_adapters"]
        return {name for name in named.split(",") if name}

    with Hold(triton_server.grpc_url, LORA_MODEL, inputs=inputs) as running:
        running.wait_responses()
        wait_for(lambda: adapters() == {"smol-alpha"}, 60, "smol-alpha in lora_requests_info")
    # Once it is cancelled the newest series names no adapter again.
    wait_for(lambda: adapters() == set(), 30, "the adapter to leave lora_requests_info")
