"""LoRA in the core, without a server: multi_lora.json, the lora_name input, admission,
and the per-adapter metric series."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from tests.adapters import adapter_dir, text
from tests.fakes import RecordingChannel, RecordingLogger, RecordingMetrics, ScriptedEngine
from tritonforge.engines.base import EngineOutput
from tritonforge.engines.lora import LoraAdapter, load_adapters
from tritonforge.serving.errors import RequestError
from tritonforge.serving.runtime import RequestRecord, Runtime
from tritonforge.serving.schema import parse_request
from tritonforge.triton.metrics import TritonMetrics

# --- multi_lora.json ------------------------------------------------------------------


def test_no_file_means_no_adapters(tmp_path: Path) -> None:
    assert load_adapters(tmp_path) == ()


def test_adapters_in_file_order_with_stable_ids_and_resolved_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ADAPTERS", str(tmp_path / "store"))
    beta = adapter_dir(tmp_path / "store", "beta", rank=4)
    alpha = adapter_dir(tmp_path, "alpha")
    (tmp_path / "multi_lora.json").write_text(
        json.dumps({"beta": "$ADAPTERS/beta", "alpha": "alpha"})  # upstream's format
    )
    assert load_adapters(tmp_path) == (
        LoraAdapter("beta", 1, beta, 4),
        LoraAdapter("alpha", 2, alpha, 8),
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{nope", "is not valid JSON"),
        ('["a"]', 'must map adapter names to directories: {"name": "/path"}'),
        ('{"a b": "x"}', "adapter name 'a b' must be letters, digits"),
        ('{"gone": "/no/such/adapter"}', "adapter 'gone': /no/such/adapter is not a PEFT adapter"),
    ],
)
def test_a_broken_file_fails_the_load_naming_it(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "multi_lora.json").write_text(content)
    with pytest.raises((ValueError, FileNotFoundError), match=r"multi_lora\.json") as info:
        load_adapters(tmp_path)
    assert message in str(info.value)


def test_an_engine_without_lora_support_refuses_the_file(tmp_path: Path) -> None:
    adapter_dir(tmp_path, "alpha")
    (tmp_path / "multi_lora.json").write_text(json.dumps({"alpha": "alpha"}))
    with pytest.raises(ValueError, match=r"multi_lora\.json: the llm engine does not serve LoRA"):
        ScriptedEngine.from_config({}, tmp_path)


# --- the lora_name input and sampling key ------------------------------------------------


def test_lora_name_as_tensor_as_sampling_key_and_as_request_parameter() -> None:
    prompt = {"text_input": text("hi")}
    by_tensor = parse_request({**prompt, "lora_name": text("alpha")})
    by_key = parse_request({**prompt, "sampling_parameters": text('{"lora_name": "alpha"}')})
    by_parameter = parse_request(prompt, {"lora_name": "alpha"})
    assert {r.sampling.lora_name for r in (by_tensor, by_key, by_parameter)} == {"alpha"}
    assert parse_request(prompt).sampling.lora_name is None


@pytest.mark.parametrize(
    ("inputs", "parameters", "field", "rule"),
    [
        ({"lora_name": text("")}, None, "lora_name", "omit it to use the base model"),
        ({"sampling_parameters": text('{"lora_name": 3}')}, None, "sampling_parameters.lora_name",
         "expected an adapter name"),
        (
            {"lora_name": text("a"), "sampling_parameters": text('{"lora_name": "b"}')},
            None,
            "lora_name",
            "names adapter 'a' but sampling_parameters.lora_name names 'b'",
        ),
    ],
)  # fmt: skip
def test_bad_lora_name_names_the_field(
    inputs: dict[str, Any], parameters: dict | None, field: str, rule: str
) -> None:
    with pytest.raises(RequestError) as info:
        parse_request({"text_input": text("hi"), **inputs}, parameters)
    assert info.value.field == field and rule in info.value.rule


# --- admission: only adapters the model serves --------------------------------------------


def engine_serving(*names: str) -> ScriptedEngine:
    engine = ScriptedEngine([EngineOutput(text="x", token_ids=[1], finished=True)])
    engine.adapters = {n: LoraAdapter(n, i, Path(n), 8) for i, n in enumerate(names, 1)}
    return engine


def test_unknown_adapter_is_refused_listing_the_available_ones() -> None:
    request = parse_request({"text_input": text("hi"), "lora_name": text("gamma")})
    with pytest.raises(RequestError) as info:
        engine_serving("beta", "alpha").prepare(request)
    assert str(info.value) == "lora_name: unknown LoRA adapter 'gamma'; available: alpha, beta"


def test_a_model_without_adapters_says_so() -> None:
    request = parse_request({"text_input": text("hi"), "lora_name": text("alpha")})
    with pytest.raises(RequestError, match="this model serves no LoRA adapters"):
        engine_serving().prepare(request)


# --- metrics ----------------------------------------------------------------------------------


def test_runtime_records_the_adapter_of_each_request() -> None:
    metrics, engine = RecordingMetrics(), engine_serving("alpha")
    runtime = Runtime(engine, metrics, RecordingLogger())
    runtime.start()
    try:
        for lora in ("alpha", None):
            inputs = {"text_input": text("hi")} | ({"lora_name": text(lora)} if lora else {})
            runtime.submit(parse_request(inputs), RecordingChannel())
        metrics.wait_for(2)
    finally:
        runtime.stop()
    assert sorted(str(r.lora) for r in metrics.records) == ["None", "alpha"]


class _Family:
    """pb_utils.MetricFamily's shape: Metric(labels) objects that count."""

    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    series: ClassVar[dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name = name

    def Metric(self, labels: dict[str, str], **_: Any) -> Any:
        key = (self.name, tuple(sorted(labels.items())))
        series = self.series

        class _Metric:
            def increment(self, value: float) -> None:
                series[key] = series.get(key, 0) + value

            def observe(self, value: float) -> None: ...

            def set(self, value: float) -> None: ...

        return _Metric()


def test_adapter_requests_get_series_of_their_own() -> None:
    _Family.series = {}
    pb_utils = type("pb_utils", (), {"MetricFamily": _Family})
    metrics = TritonMetrics(pb_utils, "vllm", {"model": "m", "version": "1"})
    for lora, outcome in (("alpha", "finished"), ("alpha", "finished"), ("beta", "failed")):
        metrics.record(RequestRecord(3, 5, 1.0, 0.1, 0.1, outcome, lora))
    metrics.record(RequestRecord(3, 5, 1.0, 0.1, 0.1, "finished"))  # the base model

    def value(name: str, **labels: str) -> float:
        key = (f"vllm:{name}", tuple(sorted({"model": "m", "version": "1", **labels}.items())))
        return _Family.series.get(key, 0)

    assert value("lora_request_outcome_total", lora="alpha", outcome="finished") == 2
    assert value("lora_request_outcome_total", lora="beta", outcome="failed") == 1
    assert value("lora_generation_tokens_total", lora="alpha") == 10
    assert value("lora_prompt_tokens_total", lora="beta") == 3
    # The model's own series count every request, adapters or not, with unchanged labels.
    assert value("request_outcome_total", outcome="finished") == 3
    assert value("generation_tokens_total") == 20


# --- the vLLM adapter's load-time checks and its zero adapter (no engine started) ------


def peft_adapter(root: Path, name: str, rank: int) -> Path:
    """A PEFT-shaped adapter directory with small real safetensors weights."""
    from safetensors.numpy import save_file

    path = adapter_dir(root, name, rank)
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    save_file(
        {
            f"{prefix}.lora_A.weight": np.full((rank, 4), 0.5, dtype=np.float32),
            f"{prefix}.lora_B.weight": np.full((4, rank), 0.25, dtype=np.float32),
        },
        path / "adapter_model.safetensors",
    )
    return path


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({}, 'multi_lora.json lists adapters but model.json does not set "enable_lora": true'),
        (
            {"enable_lora": True, "max_lora_rank": 8},
            "adapter 'wide' has rank 16, above max_lora_rank 8 in model.json",
        ),
    ],
)
def test_vllm_refuses_adapters_its_settings_cannot_serve(
    tmp_path: Path, settings: dict, message: str
) -> None:
    from tritonforge.engines.vllm import VllmEngine

    peft_adapter(tmp_path, "wide", rank=16)
    (tmp_path / "multi_lora.json").write_text('{"wide": "wide"}')
    with pytest.raises(ValueError) as info:
        VllmEngine.from_config({"model": "/m", **settings}, tmp_path)
    assert message in str(info.value)


def test_vllm_on_cpu_runs_base_requests_with_a_zero_adapter(tmp_path: Path) -> None:
    """Workaround L1: the base model's requests get an adapter whose B is zero."""
    from safetensors.numpy import load_file

    from tritonforge.engines.vllm import BASE_LORA_ID, VllmEngine

    peft_adapter(tmp_path, "alpha", rank=4)
    (tmp_path / "multi_lora.json").write_text('{"alpha": "alpha"}')
    settings = {"model": "/m", "enable_lora": True, "max_loras": 1, "max_lora_rank": 8}
    engine = VllmEngine.from_config(settings, tmp_path)
    base = engine._base_lora
    assert base is not None and base.lora_int_id == BASE_LORA_ID  # no adapter ever gets it
    assert engine._args.max_loras == 2  # one slot more: the real adapters keep theirs
    original = load_file(tmp_path / "alpha" / "adapter_model.safetensors")
    zero = load_file(Path(base.lora_path) / "adapter_model.safetensors")
    for key, weights in original.items():
        expected = weights * 0 if "lora_B" in key else weights
        np.testing.assert_array_equal(zero[key], expected)
    asyncio.run(engine.shutdown())  # never started: only the scratch directory goes
    assert not Path(base.lora_path).exists()


def test_vllm_without_adapters_at_start_keeps_the_zero_adapters_slot_for_later(
    tmp_path: Path,
) -> None:
    """Workaround L1 for adapters loaded at run time: the slot is reserved at start, the
    zero adapter made from the first adapter loaded, and max_lora counts only real ones."""
    from tritonforge.engines.vllm import BASE_LORA_ID, VllmEngine

    settings = {"model": "/m", "enable_lora": True, "max_loras": 1, "max_lora_rank": 8}
    engine = VllmEngine.from_config(settings, tmp_path)
    assert engine._base_lora is None and engine.loads_adapters
    engine._reserve_base_slot()  # what start() does first
    engine._reserve_base_slot()
    assert engine._args.max_loras == 2 and engine.stats().max_lora == 1
    engine._make_base_lora(peft_adapter(tmp_path, "gamma", rank=4))
    assert engine._base_lora is not None and engine._base_lora.lora_int_id == BASE_LORA_ID
    asyncio.run(engine.shutdown())


@pytest.mark.parametrize(
    ("settings", "field", "rule"),
    [
        ({}, "lora_control", 'model.json does not set "enable_lora": true'),
        ({"enable_lora": True, "max_lora_rank": 8}, "lora_path", "rank 16, above max_lora_rank 8"),
    ],
)
def test_vllm_refuses_a_run_time_adapter_its_settings_cannot_serve(
    tmp_path: Path, settings: dict, field: str, rule: str
) -> None:
    from tritonforge.engines.vllm import VllmEngine

    engine = VllmEngine.from_config({"model": "/m", **settings}, tmp_path)
    wide = LoraAdapter("wide", 1, peft_adapter(tmp_path, "wide", rank=16), 16)
    with pytest.raises(RequestError) as info:
        asyncio.run(engine.load_adapter(wide))
    assert info.value.field == field and rule in info.value.rule
    assert engine.adapters == {}
