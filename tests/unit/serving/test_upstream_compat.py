"""The core's side of answering as upstream vllm_backend does (docs/compatibility.md).

No server: the shared range table, an engine's refusal mapped to a named invalid
argument, outputs absent or null where nothing was computed, and the per-token
metrics record.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import numpy as np
import pytest

from tests.fakes import (
    RecordingChannel,
    RecordingMetrics,
    ScriptedEngine,
    sampling_request,
    serve_once,
    word_script,
)
from tritonforge.engines.base import EngineOutput, PreparedPrompt
from tritonforge.serving.errors import RequestError, engine_refusal
from tritonforge.serving.responses import build_outputs
from tritonforge.serving.runtime import RequestRecord, _Timing
from tritonforge.serving.sampling import SAMPLING_KEYS, SamplingParams
from tritonforge.serving.schema import ReturnFlags, parse_request
from tritonforge.triton.metrics import TritonMetrics, one_two_five_buckets


def text(value: str) -> np.ndarray:
    return np.array([value.encode()], dtype=np.object_)


# --- one table of ranges; an engine's refusal names the key ---------------------------


@pytest.mark.parametrize("value", [2.1, -0.5])
def test_temperature_outside_the_range_every_engine_accepts_is_refused(value: float) -> None:
    with pytest.raises(RequestError) as info:
        sampling_request(False, temperature=value)
    assert info.value.field == "sampling_parameters.temperature"
    assert "[0, 2]" in info.value.rule


class _Refusal(ValueError):
    """An engine error carrying the parameter it concerns (vLLM's VLLMValidationError)."""

    def __init__(self, message: str, parameter: str | None = None) -> None:
        super().__init__(message)
        self.parameter = parameter


@pytest.mark.parametrize(
    ("error", "field"),
    [
        (_Refusal("out of range", parameter="top_p"), "sampling_parameters.top_p"),
        (ValueError("n must be 1 when using greedy sampling, got 2."), "sampling_parameters.n"),
        (ValueError("min_tokens must be <= max_tokens"), "sampling_parameters.min_tokens"),
        (ValueError("stop_token_ids has a bad id"), "sampling_parameters.stop_token_ids"),
        (ValueError("something else entirely"), "sampling_parameters"),
    ],
)
def test_an_engine_refusal_names_the_key_it_concerns(error: ValueError, field: str) -> None:
    refusal = engine_refusal(error, SAMPLING_KEYS)
    assert refusal.field == field
    assert refusal.rule == f"refused by the engine: {error}"


class _PickyEngine(ScriptedEngine):
    """Refuses what the shared table allows but this engine cannot do (a wide seed)."""

    def check_sampling(self, sampling: SamplingParams) -> None:
        if sampling.seed is not None and sampling.seed >= 2**32:
            raise ValueError(f"seed must fit in 32 bits, got {sampling.seed}.")


def test_prepare_answers_an_engine_refusal_as_an_invalid_argument() -> None:
    request = parse_request(
        {"text_input": text("hi"), "sampling_parameters": text(json.dumps({"seed": 2**40}))}
    )
    with pytest.raises(RequestError) as info:
        _PickyEngine().prepare(request)
    assert info.value.field == "sampling_parameters.seed"


class _RefusesInGenerate(ScriptedEngine):
    async def generate(
        self, request_id: str, prompt: PreparedPrompt, sampling: SamplingParams
    ) -> AsyncIterator[EngineOutput]:
        raise ValueError(f"top_k must be at most 3, got {sampling.top_k}")
        yield EngineOutput()  # pragma: no cover - makes this an async generator


def test_a_value_error_before_any_output_is_the_clients_invalid_argument() -> None:
    channel = serve_once(_RefusesInGenerate(), sampling_request(False, top_k=5), RecordingChannel())
    (error,) = channel.errors()
    assert isinstance(error, RequestError) and error.field == "sampling_parameters.top_k"


# --- outputs that were not computed are absent or null ------------------------------


def test_cumulative_logprob_is_absent_when_the_engine_computed_none() -> None:
    returns = ReturnFlags(cumulative_logprob=True, logprobs=True)
    tensors = build_outputs(EngineOutput(text="a", token_ids=[1]), returns, 3)
    assert "cumulative_logprob" not in tensors
    assert tensors["logprobs"][0] == b"null"
    computed = EngineOutput(text="a", token_ids=[1], cumulative_logprob=-1.5)
    assert build_outputs(computed, returns, 3)["cumulative_logprob"][0] == np.float32(-1.5)


def test_return_logprobs_without_a_count_asks_for_no_logprobs() -> None:
    request = parse_request({"text_input": text("hi"), "return_logprobs": np.array([True])})
    assert request.returns.logprobs and request.sampling.logprobs is None


# --- metrics: one TPOT sample per output token, vllm_backend's histograms --------------


def test_timing_keeps_one_gap_per_token_after_the_first() -> None:
    timing = _Timing(prompt_tokens=4, n=1)
    timing.saw(EngineOutput(token_ids=[1, 2]))  # the first delta: one extra token
    timing.saw(EngineOutput(token_ids=[]))
    timing.saw(EngineOutput(token_ids=[3]))
    timing.saw(EngineOutput(token_ids=[4, 5, 6]))
    record = timing.record("finished")
    assert record.generation_tokens == 6
    assert len(record.token_gaps_s) == 5 and all(g >= 0 for g in record.token_gaps_s)


def test_a_served_request_records_generated_minus_one_gaps() -> None:
    metrics = RecordingMetrics()
    serve_once(ScriptedEngine(word_script(7)), sampling_request(True), RecordingChannel(), metrics)
    metrics.wait_for(1)
    (record,) = metrics.records
    assert record.generation_tokens == 7 and len(record.token_gaps_s) == 6 and record.n == 1


def test_one_two_five_buckets_stop_at_the_context() -> None:
    assert one_two_five_buckets(2048) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]
    assert one_two_five_buckets(1) == [1]


class _Family:
    """pb_utils.MetricFamily's shape, remembering every observation per family."""

    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    observed: ClassVar[dict[str, list[float]]] = {}
    buckets: ClassVar[dict[str, list[float]]] = {}
    counted: ClassVar[dict[tuple[str, str], float]] = {}

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name = name

    def Metric(self, labels: dict[str, str], buckets: list[float] | None = None) -> Any:
        name, observed, counted = self.name, self.observed, self.counted
        key = (name, labels.get("le", ""))
        if buckets is not None:
            self.buckets[name] = buckets

        class _Metric:
            def increment(self, value: float) -> None:
                counted[key] = counted.get(key, 0) + value

            def set(self, value: float) -> None: ...

            def observe(self, value: float) -> None:
                observed.setdefault(name, []).append(value)

        return _Metric()


def test_metrics_observe_per_token_and_the_request_histograms() -> None:
    _Family.observed, _Family.buckets, _Family.counted = {}, {}, {}
    pb_utils = type("pb_utils", (), {"MetricFamily": _Family})
    metrics = TritonMetrics(pb_utils, "vllm", {"model": "m", "version": "1"})
    metrics.size_by_context(100)
    gaps = (0.01, 0.02, 0.03)
    metrics.record(RequestRecord(5, 4, 1.0, 0.1, 0.02, "finished", token_gaps_s=gaps, n=2))
    seen, counted = _Family.observed, _Family.counted
    # One sample per token, written as a histogram's cumulative counters.
    tpot = "vllm:time_per_output_token_seconds"
    assert counted[(f"{tpot}_count", "")] == 3
    assert counted[(f"{tpot}_sum", "")] == pytest.approx(0.06)
    assert counted[(f"{tpot}_bucket", "0.01")] == 1
    assert counted[(f"{tpot}_bucket", "0.025")] == 2
    assert counted[(f"{tpot}_bucket", "0.05")] == 3
    assert counted[(f"{tpot}_bucket", "+Inf")] == 3
    assert seen["vllm:mean_time_per_output_token_seconds"] == [0.02]
    assert seen["vllm:request_prompt_tokens"] == [5]
    assert seen["vllm:request_generation_tokens"] == [4]
    assert seen["vllm:request_params_n"] == [2]
    assert _Family.buckets["vllm:request_prompt_tokens"] == [1, 2, 5, 10, 20, 50, 100]
    assert _Family.buckets["vllm:request_params_n"] == [1, 2, 5, 10, 20]


# --- n > 1: one request, n sequences, each response one element per sequence ----------


class _TwoSequences(ScriptedEngine):
    """Deltas of two sequences, interleaved as an engine steps them."""

    max_n = 2

    def __init__(self) -> None:
        super().__init__(
            [
                EngineOutput(text="a", token_ids=[1], index=0),
                EngineOutput(text="b", token_ids=[2], index=1),
                EngineOutput(text="", token_ids=[3], index=1),  # no text yet: waits
                EngineOutput(
                    text="c", token_ids=[4], index=0, finished=True, finish_reason="length"
                ),
                EngineOutput(text="d", token_ids=[5], index=1, finished=True, finish_reason="stop"),
            ]
        )


def _texts(tensors: dict[str, np.ndarray]) -> list[str]:
    return [value.decode() for value in tensors["text_output"]]


def _flags(stream: bool) -> dict[str, np.ndarray]:
    return {
        name: np.array([True])
        for name in ("return_finish_reason", "return_num_output_tokens", "return_num_input_tokens")
    } | {"stream": np.array([stream])}


def _request(stream: bool, **sampling: object):
    inputs = {"text_input": text("hi"), "sampling_parameters": text(json.dumps(sampling))}
    return parse_request(inputs | _flags(stream))


def test_n_sequences_not_streamed_come_in_one_response_one_element_each() -> None:
    channel = serve_once(_TwoSequences(), _request(False, n=2), RecordingChannel())
    (tensors,) = channel.responses()
    assert _texts(tensors) == ["hiac", "hibd"]  # each echoes the prompt, as upstream
    assert [r.decode() for r in tensors["finish_reason"]] == ["length", "stop"]
    assert tensors["num_output_tokens"].tolist() == [2, 3]
    assert tensors["num_input_tokens"].tolist() == [2]


def test_n_sequences_streamed_carry_each_sequences_delta_in_its_place() -> None:
    channel = serve_once(_TwoSequences(), _request(True, n=2), RecordingChannel())
    sent = channel.responses()
    assert all(len(_texts(t)) == 2 for t in sent)
    assert ["".join(t) for t in zip(*(_texts(t) for t in sent), strict=True)] == ["ac", "bd"]
    totals = np.sum([t["num_output_tokens"] for t in sent], axis=0).tolist()
    assert totals == [2, 3]
    reasons = [{r.decode() for r in t["finish_reason"][i : i + 1]} for t in sent for i in (0, 1)]
    ended = [set().union(*reasons[i::2]) - {"None"} for i in (0, 1)]
    assert ended == [{"length"}, {"stop"}]  # each once, however responses were coalesced
    assert channel.sent[-1][2] is True and len(channel.errors()) == 0


def test_n_beyond_what_the_engine_samples_together_is_refused_naming_n() -> None:
    with pytest.raises(RequestError) as info:
        ScriptedEngine().prepare(_request(False, n=2))
    assert info.value.field == "sampling_parameters.n"
    assert "at most 1 sequence" in info.value.rule


def test_output_ids_of_n_sequences_are_refused_naming_the_flag() -> None:
    inputs = {
        "text_input": text("hi"),
        "sampling_parameters": text(json.dumps({"n": 2})),
        "return_output_ids": np.array([True]),
    }
    with pytest.raises(RequestError) as info:
        parse_request(inputs)
    assert info.value.field == "return_output_ids"
