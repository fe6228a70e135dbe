"""SLO and priority keys: validated like every sampling key, model defaults below the
request, a priority refused by an engine that cannot order its queue, and the runtime
refusing at once a request whose SLO admission says cannot be met."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fakes import (
    RecordingChannel,
    RecordingLogger,
    RecordingMetrics,
    ScriptedEngine,
    sampling_request,
    serve_once,
)
from tritonforge.engines.base import EngineOutput
from tritonforge.serving.admission import Admission, AdmissionSettings, SloUnattainable
from tritonforge.serving.errors import RequestError
from tritonforge.serving.runtime import Runtime
from tritonforge.serving.schema import parse_request


def parse(defaults: dict | None = None, **sampling: object):
    request = sampling_request(False, **sampling)
    if defaults is None:
        return request
    inputs = {"text_input": np.array([b"hi"], dtype=np.object_)}
    return parse_request(inputs, {k: v for k, v in sampling.items()}, None, defaults)


def test_slo_and_priority_keys_are_typed() -> None:
    sampling = parse(slo_ttft_ms="250", slo_tpot_ms=40, priority="-5").sampling
    assert (sampling.slo_ttft_ms, sampling.slo_tpot_ms, sampling.priority) == (250.0, 40.0, -5)
    default = parse().sampling
    assert (default.slo_ttft_ms, default.slo_tpot_ms, default.priority) == (None, None, 0)


@pytest.mark.parametrize(
    ("key", "value", "rule"),
    [
        ("slo_ttft_ms", 0, "must be a positive number of milliseconds"),
        ("slo_tpot_ms", "fast", "expected a number"),
        ("priority", 101, "must be an integer in [-100, 100] (lower runs first)"),
        ("priority", 1.5, "expected an integer"),
    ],
)
def test_bad_values_name_the_key_and_the_rule(key: str, value: object, rule: str) -> None:
    with pytest.raises(RequestError) as info:
        parse(**{key: value})
    assert info.value.field == f"sampling_parameters.{key}"
    assert rule in info.value.rule


def test_model_defaults_rank_below_every_request_channel() -> None:
    defaults = {"slo_ttft_ms": 500.0, "priority": 3}
    assert parse(defaults).sampling.slo_ttft_ms == 500.0
    request = parse(defaults, slo_ttft_ms=100)
    assert (request.sampling.slo_ttft_ms, request.sampling.priority) == (100.0, 3)


def test_an_engine_that_cannot_order_its_queue_refuses_a_priority() -> None:
    engine = ScriptedEngine([EngineOutput(text="a", token_ids=[1], finished=True)])
    engine.prepare(parse(priority=0))  # the default is always fine
    with pytest.raises(RequestError) as info:
        engine.prepare(parse(priority=2))
    assert info.value.field == "sampling_parameters.priority"
    assert "first come, first served" in info.value.rule


def test_runtime_refuses_at_once_and_serves_the_rest() -> None:
    """Refused in submit() (no engine work, no FINAL of its own: the edge answers it);
    a request without an SLO is served as if admission were not there."""
    engine = ScriptedEngine([EngineOutput(text="a", token_ids=[1], finished=True)])
    admission = Admission(AdmissionSettings(mode="on", min_samples=1))
    admission.predictor.prefill_s_per_token = 1.0  # one second per prompt token
    admission.predictor.samples = 5
    runtime = Runtime(engine, RecordingMetrics(), RecordingLogger(), admission=admission)
    runtime.start()
    try:
        with pytest.raises(SloUnattainable, match="slo_ttft_ms 10 ms"):
            runtime.submit(sampling_request(False, slo_ttft_ms=10), RecordingChannel())
        channel = RecordingChannel()
        runtime.submit(sampling_request(False), channel)
        assert channel.done.wait(10)
        assert not channel.errors()
    finally:
        runtime.stop()
    assert admission.snapshot().decisions == {
        "admitted": 0,
        "no_slo": 1,
        "refused_ttft": 1,
        "refused_tpot": 0,
    }


def test_runtime_refuses_by_the_tpot_rule_without_preparing_the_prompt() -> None:
    engine = ScriptedEngine([EngineOutput(text="a", token_ids=[1], finished=True)])
    prepared = []
    prepare = engine.prepare
    engine.prepare = lambda request: prepared.append(request) or prepare(request)  # type: ignore[method-assign]
    admission = Admission(AdmissionSettings(mode="on", min_samples=1))
    admission.predictor.prefill_s_per_token, admission.predictor.samples = 1e-6, 5
    admission.predictor.step_s = {1: 0.5}  # half a second a step
    runtime = Runtime(engine, RecordingMetrics(), RecordingLogger(), admission=admission)
    runtime.start()
    try:
        with pytest.raises(SloUnattainable, match="slo_tpot_ms 100 ms"):
            runtime.submit(sampling_request(False, slo_tpot_ms=100), RecordingChannel())
        assert prepared == []  # refused before the tokenizer ran
        channel = RecordingChannel()
        runtime.submit(sampling_request(False, slo_tpot_ms=1000), channel)
        assert channel.done.wait(10)
        assert not channel.errors() and len(prepared) == 1
    finally:
        runtime.stop()
    assert admission.snapshot().decisions["refused_tpot"] == 1


def test_runtime_feeds_admission_the_tokens_and_releases_the_request() -> None:
    engine = ScriptedEngine(
        [
            EngineOutput(text="a", token_ids=[1]),
            EngineOutput(text="b", token_ids=[2], finished=True),
        ]
    )
    admission = Admission(AdmissionSettings(mode="observe"))
    serve_once(
        engine, sampling_request(True, slo_ttft_ms=1000), RecordingChannel(), admission=admission
    )
    assert admission.predictor.samples == 1  # the first token calibrated the prefill
    assert admission.snapshot().decisions["admitted"] == 1
    admission.admit("next", 1, parse().sampling)  # nothing left queued from the first


@pytest.mark.parametrize("policy", [None, "fcfs", "priority"])
def test_vllm_orders_by_priority_only_under_its_priority_policy(
    tmp_path, policy: str | None
) -> None:
    from tritonforge.engines.vllm import VllmEngine

    settings = {"model": "/m"} | ({} if policy is None else {"scheduling_policy": policy})
    engine = VllmEngine.from_config(settings, tmp_path)
    if policy == "priority":
        assert engine.priority_unsupported is None
    else:
        assert 'set "scheduling_policy": "priority" in model.json' in str(
            engine.priority_unsupported
        )


def test_llamacpp_keeps_its_waiting_line_in_priority_order() -> None:
    """Lower first; first come first served within a priority (no model needed)."""
    from tritonforge.engines.llamacpp import LlamaCppEngine, _Job

    engine = LlamaCppEngine({"model_path": "unused.gguf"})
    assert engine.priority_unsupported is None
    arrivals = [("a", 0), ("b", 5), ("c", -3), ("d", 0), ("e", -3)]
    for name, priority in arrivals:
        sampling = parse(priority=priority).sampling
        engine._enqueue(_Job(name, [1], sampling, None, lambda item: None))
    assert [job.request_id for job in engine._waiting] == ["c", "e", "a", "d", "b"]
