"""CONTRACT TEST — the TensorRT-LLM adapter against a stand-in of the documented LLM API.

TensorRT-LLM needs a CUDA GPU; these machines have none. This suite checks the
adapter's side of the contract — how model.yaml becomes ``LLM(**kwargs)``, how the
common sampling vocabulary becomes ``SamplingParams``, how streamed
``RequestOutput``/``CompletionOutput`` steps become deltas, finish reasons, abort and
shutdown — against tests/contract/trtllm_standin.py, which follows the documented API.
It says nothing about TensorRT-LLM itself working: that is docker/run_gpu_tests.sh
(the same end-to-end suite as the other engines, on a GPU machine).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.contract import trtllm_standin as trt
from tests.fakes import RecordingChannel, RecordingLogger, RecordingMetrics
from tritonforge.engines.base import EngineOutput
from tritonforge.engines.tensorrtllm import LlmApi, TensorRTLLMEngine, split_model_yaml
from tritonforge.serving.errors import RequestError
from tritonforge.serving.runtime import Runtime
from tritonforge.serving.sampling import PRIORITY_LIMIT
from tritonforge.serving.schema import parse_request

pytestmark = pytest.mark.contract


class StandInEngine(TensorRTLLMEngine):
    """The adapter bound to the stand-in instead of TensorRT-LLM's LLM API."""

    llm_api = LlmApi(
        trt.LLM, trt.SamplingParams, trt.GuidedDecodingParams, trt.LoRARequest, trt.LoraConfig
    )


MODEL_YAML = {
    "model": "$TRITONFORGE_TEST_MODEL/llm",
    "backend": "pytorch",
    "max_seq_len": 256,
    "guided_decoding_backend": "xgrammar",
    "triton_config": {"decoupled": True, "max_batch_size": 0, "cancellation_check_period_ms": 50},
}


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> TensorRTLLMEngine:
    monkeypatch.setenv("TRITONFORGE_TEST_MODEL", "/models")
    engine = StandInEngine.from_config(MODEL_YAML, Path("/repo/m/1"))
    asyncio.run(engine.start())
    return engine


def request(**sampling: Any):
    inputs = {
        "text_input": np.array([b"Say hello"], dtype=np.object_),
        "sampling_parameters": np.array([json.dumps(sampling).encode()], dtype=np.object_),
    }
    return parse_request(inputs)


async def collect(engine: TensorRTLLMEngine, request_id: str, **sampling: Any):
    parsed = request(**sampling)
    prompt = engine.prepare(parsed)
    return [d async for d in engine.generate(request_id, prompt, parsed.sampling)]


def run(engine: TensorRTLLMEngine, **sampling: Any) -> list[EngineOutput]:
    return asyncio.run(collect(engine, "r1", **sampling))


def sent(engine: TensorRTLLMEngine) -> tuple[Any, trt.SamplingParams, bool]:
    return engine._llm.requests[-1]


# --- model.yaml -> LLM(**kwargs) ---------------------------------------------------


def test_model_yaml_keys_go_to_the_llm_and_triton_config_stays_out(engine) -> None:
    llm = engine._llm
    assert llm.kwargs == {
        "model": "/models/llm",  # $VAR expanded
        "backend": "pytorch",
        "max_seq_len": 256,
        "guided_decoding_backend": "xgrammar",
    }
    assert engine.max_context == 256
    assert engine.cancellation_poll_s == 0.05


@pytest.mark.parametrize(
    ("triton_config", "fragment"),
    [
        ({"decoupled": False}, "decoupled must be true"),
        ({"max_batch_size": 8}, "max_batch_size must be 0"),
        ({"instance_count": 2}, "triton_config.instance_count is not supported"),
    ],
)
def test_triton_config_the_core_cannot_honour_is_refused(triton_config, fragment) -> None:
    with pytest.raises(ValueError, match=fragment):
        split_model_yaml({"model": "m", "triton_config": triton_config})


# --- sampling vocabulary -> SamplingParams -------------------------------------------


def test_greedy_maps_to_top_k_1_and_keeps_the_api_greedy(engine) -> None:
    run(engine, temperature=0, max_tokens=4)
    _, params, streaming = sent(engine)
    assert streaming is True
    assert params._greedy_decoding
    assert (params.top_k, params.top_p, params.temperature) == (1, None, None)
    assert params.max_tokens == 4 and params.n == 1


def test_sampling_keys_map_one_to_one(engine) -> None:
    run(
        engine,
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        min_p=0.05,
        seed=7,
        max_tokens=5,
        min_tokens=2,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        repetition_penalty=1.1,
        stop=["zz"],
        stop_token_ids=[33],
        ignore_eos=True,
        skip_special_tokens=False,
        logprobs=0,
    )
    inputs, p, _ = sent(engine)
    assert inputs == {"prompt_token_ids": [ord(c) for c in "Say hello"]}
    assert not p._greedy_decoding
    assert (p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (0.7, 0.9, 20, 0.05, 7)
    assert (p.max_tokens, p.min_tokens) == (5, 2)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.5, 0.25, 1.1)
    assert (p.stop, p.stop_token_ids, p.ignore_eos) == (["zz"], [33], True)
    assert p.skip_special_tokens is False
    assert p.logprobs == 1  # vLLM's 0 ("the sampled token") is the LLM API's 1


def test_unseeded_requests_get_distinct_seeds(engine) -> None:
    run(engine, max_tokens=2)
    run(engine, max_tokens=2)
    first, second = (r[1].seed for r in engine._llm.requests[-2:])
    assert first is not None and second is not None and first != second


@pytest.mark.parametrize(
    ("structured", "expected"),
    [
        ({"json": {"type": "object"}}, {"json": {"type": "object"}}),
        ({"regex": "[0-9]+"}, {"regex": "[0-9]+"}),
        ({"grammar": 'root ::= "a"'}, {"grammar": 'root ::= "a"'}),
        ({"json_object": True}, {"json_object": True}),
        ({"choice": ["yes", "n.o"]}, {"regex": "yes|n\\.o"}),
    ],
)
def test_structured_outputs_map_to_guided_decoding(engine, structured, expected) -> None:
    run(engine, max_tokens=2, structured_outputs=structured)
    guided = sent(engine)[1].guided_decoding
    assert isinstance(guided, trt.GuidedDecodingParams)
    assert {k: getattr(guided, k) for k in expected} == expected


def test_compact_json_is_an_ebnf_grammar_without_free_whitespace(engine) -> None:
    """GuidedDecodingParams has no whitespace switch: compact JSON goes as xgrammar's
    EBNF (its own grammar library), which accepts the compact answer and nothing looser."""
    import xgrammar

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    for structured in ({"json": schema}, {"json_object": True}):
        run(engine, max_tokens=2, structured_outputs={**structured, "disable_any_whitespace": True})
        guided = sent(engine)[1].guided_decoding
        assert guided.grammar and not guided.json and not guided.json_object
        compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo(["a"]))
        compiled = compiler.compile_grammar(xgrammar.Grammar.from_ebnf(guided.grammar))
        assert xgrammar.GrammarMatcher(compiled).accept_string('{"a": 1}')
        assert not xgrammar.GrammarMatcher(compiled).accept_string('{ "a": 1}')


# --- streamed outputs -> deltas ------------------------------------------------------


def test_deltas_concatenate_to_the_whole_answer(engine) -> None:
    deltas = run(engine, temperature=0, max_tokens=64)
    assert "".join(d.text for d in deltas) == trt.SCRIPT
    ids = [t for d in deltas for t in d.token_ids]
    assert ids == [ord(c) for c in trt.SCRIPT] + [trt.END_ID]
    assert [d.finished for d in deltas].count(True) == 1 and deltas[-1].finished
    assert deltas[-1].finish_reason == "stop"  # the end token


def test_max_tokens_finishes_with_length(engine) -> None:
    deltas = run(engine, max_tokens=5)
    assert "".join(d.text for d in deltas) == trt.SCRIPT[:5]
    assert deltas[-1].finish_reason == "length"


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_cut_exactly_and_never_streamed_early(engine, include: bool) -> None:
    deltas = run(engine, max_tokens=64, stop=["wörld"], include_stop_str_in_output=include)
    text = "".join(d.text for d in deltas)
    assert text == ("Hello, wörld" if include else "Hello, ")
    # Nothing past the cut was ever streamed: no delta shows "w" before the stop is known.
    assert all("w" not in d.text for d in deltas[:-1])
    assert deltas[-1].finish_reason == "stop"
    assert sent(engine)[1].include_stop_str_in_output is True  # the adapter cuts


def test_logprobs_and_cumulative_logprob(engine) -> None:
    deltas = run(engine, max_tokens=3, logprobs=2)
    entries = [e for d in deltas for e in d.logprobs]
    assert len(entries) == 3
    first = entries[0][ord("H")]
    assert first == {"logprob": -0.25, "rank": 1, "decoded_token": "H"}
    assert deltas[-1].cumulative_logprob == pytest.approx(-0.75)


# --- cancellation and shutdown -------------------------------------------------------


def test_abort_reaches_the_engine_and_ends_the_stream(engine) -> None:
    async def scenario() -> list[EngineOutput]:
        parsed = request(max_tokens=64)
        stream = engine.generate("r9", engine.prepare(parsed), parsed.sampling)
        out = [await stream.__anext__(), await stream.__anext__()]
        await engine.abort("r9")
        out += [d async for d in stream]
        return out

    deltas = asyncio.run(scenario())
    assert engine._llm.aborted == [1]
    assert deltas[-1].finished and deltas[-1].finish_reason == "abort"  # 'cancelled'
    assert engine.stats().running == 0


def test_consumer_leaving_early_aborts_the_request(engine) -> None:
    async def scenario() -> None:
        parsed = request(max_tokens=64)
        stream = engine.generate("r3", engine.prepare(parsed), parsed.sampling)
        await stream.__anext__()
        await stream.aclose()

    asyncio.run(scenario())
    assert engine._llm.aborted == [1]


def test_shutdown_shuts_the_llm_down(engine) -> None:
    llm = engine._llm
    asyncio.run(engine.shutdown())
    assert llm.is_shut_down


def test_chat_goes_through_the_tokenizers_template(engine) -> None:
    text = engine.render_chat(({"role": "user", "content": "hi"},))
    assert text == "<user>hi</user><assistant>"


def test_prompt_longer_than_max_seq_len_is_a_request_error(engine) -> None:
    parsed = parse_request({"text_input": np.array([b"x" * 300], dtype=np.object_)})
    with pytest.raises(RequestError, match="text_input: prompt is 300 tokens"):
        engine.prepare(parsed)


def test_prompt_plus_max_tokens_beyond_max_seq_len_is_a_request_error(engine) -> None:
    """The core's context rule reaches this adapter: max_seq_len is its context."""
    prompt = engine.prepare(request())
    fits = 256 - len(prompt.token_ids)
    assert engine.prepare(request(max_tokens=fits)) == prompt
    with pytest.raises(RequestError) as info:
        engine.prepare(request(max_tokens=fits + 1))
    assert info.value.field == "sampling_parameters.max_tokens"
    assert f"prompt ({len(prompt.token_ids)} tokens) + max_tokens ({fits + 1})" in info.value.rule
    assert "context of 256 tokens" in info.value.rule


# --- the whole core path: Runtime + adapter + stand-in -------------------------------


def test_runtime_streams_and_cancels_through_the_adapter(monkeypatch) -> None:
    monkeypatch.setenv("TRITONFORGE_TEST_MODEL", "/models")
    engine = StandInEngine.from_config(MODEL_YAML, Path("/repo/m/1"))
    metrics, logger = RecordingMetrics(), RecordingLogger()
    runtime = Runtime(engine, metrics, logger, max_inflight=4, cancellation_poll_s=0.01)
    runtime.start()
    try:
        sampling = np.array([b'{"max_tokens": 64, "temperature": 0}'], dtype=np.object_)
        prompt = np.array([b"Say hello"], dtype=np.object_)
        whole, streamed = RecordingChannel(), RecordingChannel()
        common = {"text_input": prompt, "sampling_parameters": sampling}
        exclude = {"exclude_input_in_output": np.array([True])}
        runtime.submit(parse_request({**common, **exclude}), whole)
        runtime.submit(parse_request({**common, "stream": np.array([True])}), streamed)
        metrics.wait_for(2)
        text = b"".join(t["text_output"][0] for t in streamed.responses()).decode()
        assert whole.sent[-1][0]["text_output"][0].decode() == text == trt.SCRIPT
        assert len(streamed.sent) > 1 and streamed.sent[-1][2]

        cancelled = RecordingChannel(cancel_after=3)
        # 200: within max_seq_len (256), which the core enforces for prompt + max_tokens.
        long = np.array([b'{"max_tokens": 200, "ignore_eos": true}'], dtype=np.object_)
        stream = {"text_input": prompt, "sampling_parameters": long, "stream": np.array([True])}
        runtime.submit(parse_request(stream), cancelled)
        metrics.wait_for(3)
        assert metrics.records[-1].outcome == "cancelled"
        assert engine._llm.aborted  # the engine was told, not just the client
        assert isinstance(cancelled.sent[-1][1], asyncio.CancelledError)
    finally:
        runtime.stop()
    assert engine._llm is None
    assert logger.errors == []


# --- LoRA ----------------------------------------------------------------------------


@pytest.fixture
def lora_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TensorRTLLMEngine:
    """The adapter on a model.yaml with two PEFT adapters listed in multi_lora.json."""
    monkeypatch.setenv("TRITONFORGE_TEST_MODEL", "/models")
    for name, rank in (("pirate", 8), ("poet", 4)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text(json.dumps({"r": rank}))
    listed = {"pirate": str(tmp_path / "pirate"), "poet": "poet"}  # relative: version dir
    (tmp_path / "multi_lora.json").write_text(json.dumps(listed))
    settings = {**MODEL_YAML, "lora_config": {"max_cpu_loras": 4}}
    engine = StandInEngine.from_config(settings, tmp_path)
    asyncio.run(engine.start())
    return engine


def test_multi_lora_json_becomes_the_llms_lora_config(lora_engine, tmp_path: Path) -> None:
    config = lora_engine._llm.kwargs["lora_config"]
    assert config == trt.LoraConfig(
        lora_dir=[str(tmp_path / "pirate"), str(tmp_path / "poet")],
        max_lora_rank=8,  # the largest adapter's rank
        max_loras=2,
        max_cpu_loras=4,  # model.yaml's own lora_config keys win
    )


def test_each_request_carries_its_adapters_lora_request(lora_engine, tmp_path: Path) -> None:
    for lora in ("poet", None, "pirate", "poet"):
        run(lora_engine, **({"lora_name": lora} if lora else {}))
    assert lora_engine._llm.lora_requests == [
        trt.LoRARequest("poet", 2, str(tmp_path / "poet")),
        None,
        trt.LoRARequest("pirate", 1, str(tmp_path / "pirate")),
        trt.LoRARequest("poet", 2, str(tmp_path / "poet")),  # the same id every time
    ]


def test_unknown_adapter_is_refused_before_the_llm_sees_it(lora_engine) -> None:
    with pytest.raises(RequestError, match="unknown LoRA adapter 'sage'; available: pirate, poet"):
        lora_engine.prepare(request(lora_name="sage"))
    assert lora_engine._llm.requests == []


def test_lora_dir_in_model_yaml_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "adapter_config.json").write_text('{"r": 8}')
    (tmp_path / "multi_lora.json").write_text('{"a": "a"}')
    settings = {**MODEL_YAML, "model": "/models/llm", "lora_config": {"lora_dir": ["/x"]}}
    with pytest.raises(ValueError, match=r"lora_config\.lora_dir is set from multi_lora\.json"):
        StandInEngine.from_config(settings, tmp_path)


# --- priority: the common scale (lower first) on TensorRT-LLM's (higher first, [0, 1]) ---


@pytest.mark.parametrize(
    ("priority", "expected"),
    [(-PRIORITY_LIMIT, 1.0), (-50, 0.75), (50, 0.25), (PRIORITY_LIMIT, 0.0)],
)
def test_priority_is_reversed_and_scaled_onto_trtllms(engine, priority: int, expected) -> None:
    run(engine, priority=priority, max_tokens=2)
    assert engine._llm.priorities[-1] == pytest.approx(expected)


def test_default_priority_leaves_the_llms_default(engine) -> None:
    run(engine, max_tokens=2)
    assert engine._llm.priorities[-1] == trt.DEFAULT_REQUEST_PRIORITY


def test_more_urgent_in_the_common_scale_is_more_urgent_in_trtllms(engine) -> None:
    run(engine, priority=-1, max_tokens=2)
    run(engine, priority=1, max_tokens=2)
    urgent, relaxed = engine._llm.priorities[-2:]
    assert urgent > trt.DEFAULT_REQUEST_PRIORITY > relaxed
