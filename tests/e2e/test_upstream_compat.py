"""Drop-in as upstream judges it: where vllm_backend's clients and OpenAI's see the same
answers through the real server (docs/compatibility.md lists each difference kept).

Few, short requests on the session server; every model's answer is read for its shape,
never its words.
"""

from __future__ import annotations

import json

import httpx
import pytest
import requests
import tritonclient.grpc as grpcclient

from tests.e2e.client import (
    generate,
    llm_inputs,
    metric,
    model_ready,
    stream,
    wait_for,
)
from tritonforge.launch.launcher import OpenAIFrontend, TritonServer

MODEL = "vllm_model"
ENGINES = ("vllm_model", "llamacpp_model")
SHORT = {"max_tokens": 2, "temperature": 0}


def _root(frontend: OpenAIFrontend) -> str:
    return frontend.base_url.removesuffix("/v1")


def _need(server: TritonServer, model: str) -> None:
    if not model_ready(server, model):
        pytest.skip(f"{model} is not loaded on this server")


# --- one table of ranges; refusals are 400s naming the field -------------------------


@pytest.mark.parametrize("model", ENGINES)
def test_a_temperature_no_engine_accepts_is_a_400_naming_it_on_every_path(
    triton_server: TritonServer, frontend: OpenAIFrontend, model: str
) -> None:
    _need(triton_server, model)
    body = {"model": model, "prompt": "Hello", "temperature": 2.1, "max_tokens": 4}
    reply = httpx.post(f"{frontend.base_url}/completions", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "temperature"
    answer = generate(
        triton_server.http_url,
        model,
        {"text_input": "Hello", "parameters": {"temperature": 2.1, "max_tokens": 4}},
    )
    assert answer["error"].startswith("parameters.temperature: must be in [0, 2]"), answer


# --- outputs not computed are absent or null, as vllm_backend sends them ---------------


def test_outputs_that_were_not_computed_are_absent_or_null(triton_server: TritonServer) -> None:
    result = stream(
        triton_server.grpc_url,
        MODEL,
        llm_inputs(
            "Hello",
            SHORT,
            stream=False,
            return_cumulative_logprob=True,
            return_logprobs=True,
        ),
    )
    assert result.error is None, result.error
    (response,) = result.responses
    assert response.as_numpy("cumulative_logprob") is None  # no made-up 0.0
    assert response.as_numpy("logprobs")[0] == b"null"  # no count asked: null


# --- vllm_backend's metric families, counted as it counts them ----------------------


def test_vllm_backend_metric_families_count_as_upstream(triton_server: TritonServer) -> None:
    url = triton_server.metrics_url
    names = (
        "vllm:time_per_output_token_seconds_count",
        "vllm:request_prompt_tokens_count",
        "vllm:request_generation_tokens_sum",
        "vllm:request_params_n_sum",
        "vllm:e2e_request_latency_seconds_count",
    )
    before = {n: metric(url, n, model=MODEL) for n in names}
    for prompt in ("One", "Two"):
        sampling = {"max_tokens": 5, "ignore_eos": True, "temperature": 0}
        result = stream(triton_server.grpc_url, MODEL, llm_inputs(prompt, sampling, stream=False))
        assert result.error is None, result.error

    def grown() -> dict[str, float]:
        return {n: metric(url, n, model=MODEL) - before[n] for n in names}

    wait_for(lambda: grown()["vllm:e2e_request_latency_seconds_count"] >= 2, 30, "the two records")
    assert grown() == {
        "vllm:time_per_output_token_seconds_count": 8,  # one per token after the first
        "vllm:request_prompt_tokens_count": 2,
        "vllm:request_generation_tokens_sum": 10,
        "vllm:request_params_n_sum": 2,
        "vllm:e2e_request_latency_seconds_count": 2,
    }


# --- the OpenAI routes: one model, readiness, metrics -----------------------------------


def test_openai_routes_for_one_model_readiness_and_metrics(frontend: OpenAIFrontend) -> None:
    card = httpx.get(f"{frontend.base_url}/models/{MODEL}", timeout=30)
    assert card.status_code == 200 and card.json()["id"] == MODEL
    missing = httpx.get(f"{frontend.base_url}/models/no_such_model", timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    ready = httpx.get(f"{_root(frontend)}/health/ready", timeout=30)
    assert ready.status_code == 200 and MODEL in ready.json()["models"]
    page = httpx.get(f"{_root(frontend)}/metrics", timeout=30)
    assert page.status_code == 200 and "vllm:request_params_n" in page.text


#: A model loaded only by the test below: a Python model whose start fails on purpose,
#: and then one that starts (a load of the name clears Triton's server-wide readiness).
PROBE = "compat_failed_load"
PROBE_CONFIG = json.dumps(
    {
        "backend": "python",
        "max_batch_size": 0,
        "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [1]}],
    }
)
FAILING = (
    b"class TritonPythonModel:\n"
    b"    def initialize(self, args):\n"
    b"        raise ValueError('on purpose')\n"
)
STARTING = b"class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"


def _triton_ready(server: TritonServer) -> bool:
    return requests.get(f"http://{server.http_url}/v2/health/ready", timeout=10).ok


def test_a_failed_load_leaves_the_frontends_health_up(
    triton_server: TritonServer, frontend: OpenAIFrontend
) -> None:
    """Triton 2.51's server-wide readiness turns 400 after a failed load; /health stays
    200 while the models this frontend serves are ready."""
    with grpcclient.InferenceServerClient(triton_server.grpc_url) as client:
        with pytest.raises(Exception, match="UNAVAILABLE"):
            client.load_model(PROBE, config=PROBE_CONFIG, files={"file:1/model.py": FAILING})
        try:
            assert not _triton_ready(triton_server)  # Triton's own, documented
            assert client.is_model_ready(MODEL)
            health = httpx.get(f"{_root(frontend)}/health", timeout=30)
            assert health.status_code == 200 and health.json() == {"status": "ok"}
        finally:
            client.load_model(PROBE, config=PROBE_CONFIG, files={"file:1/model.py": STARTING})
            client.unload_model(PROBE)
    wait_for(lambda: _triton_ready(triton_server), 60, "Triton's readiness back")


# --- priority: honoured or refused on every transport that reaches the model ----------


def test_priority_is_refused_on_every_transport_of_a_first_come_model(
    triton_server: TritonServer, frontend: OpenAIFrontend
) -> None:
    answer = generate(
        triton_server.http_url, MODEL, {"text_input": "Hi", "parameters": {**SHORT, "priority": 5}}
    )
    assert "priority" in answer.get("error", ""), answer
    result = stream(
        triton_server.grpc_url, MODEL, llm_inputs("Hi", {**SHORT, "priority": 5}, stream=False)
    )
    assert result.error is not None and "sampling_parameters.priority" in str(result.error)
    body = {"model": MODEL, "prompt": "Hi", "priority": 5, **SHORT}
    reply = httpx.post(f"{frontend.base_url}/completions", json=body, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "priority"


def test_priority_as_a_generate_parameter_is_honoured_where_the_model_orders_by_it(
    triton_server: TritonServer,
) -> None:
    _need(triton_server, "llamacpp_model")  # its waiting line is kept in priority order
    answer = generate(
        triton_server.http_url,
        "llamacpp_model",
        {"text_input": "Hi", "parameters": {**SHORT, "priority": -5}},
    )
    assert "error" not in answer and isinstance(answer["text_output"], str), answer


# --- n > 1: n sequences from one prompt evaluation; past what the engine can, refused ---

SEVERAL = {"n": 2, "temperature": 0.8, "seed": 7, "max_tokens": 4, "ignore_eos": True}


@pytest.mark.parametrize("model", ENGINES)
def test_n_sequences_come_one_element_each_in_every_response(
    triton_server: TritonServer, model: str
) -> None:
    _need(triton_server, model)
    flags = {"return_num_output_tokens": True, "return_finish_reason": True}
    whole = stream(
        triton_server.grpc_url, model, llm_inputs("Once", SEVERAL, stream=False, **flags)
    )
    assert whole.error is None, whole.error
    (response,) = whole.responses
    assert response.as_numpy("text_output").shape == (2,)
    assert response.as_numpy("num_output_tokens").tolist() == [4, 4]
    assert response.as_numpy("finish_reason").tolist() == [b"length", b"length"]
    streamed = stream(triton_server.grpc_url, model, llm_inputs("Once", SEVERAL, **flags))
    assert streamed.error is None, streamed.error
    counts = [r.as_numpy("num_output_tokens").tolist() for r in streamed.responses]
    assert all(len(c) == 2 for c in counts)
    assert [sum(c[i] for c in counts) for i in (0, 1)] == [4, 4]


def test_n_choices_through_openai_with_usage_summed(frontend: OpenAIFrontend) -> None:
    body = {"model": MODEL, "prompt": "Once", **SEVERAL}
    answer = httpx.post(f"{frontend.base_url}/completions", json=body, timeout=120).json()
    assert sorted(c["index"] for c in answer["choices"]) == [0, 1], answer
    assert answer["usage"]["completion_tokens"] == 8
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    with httpx.stream(
        "POST", f"{frontend.base_url}/chat/completions", json=chat | SEVERAL, timeout=120
    ) as reply:
        events = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    ended = {c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]}
    assert ended == {0, 1}


@pytest.mark.parametrize(
    ("model", "sampling", "rule"),
    [
        (MODEL, {"n": 2, "temperature": 0}, "greedy"),  # vLLM's own refusal, named
        ("llamacpp_model", {**SEVERAL, "n": 9}, "at most 8 sequence(s)"),  # n_parallel
    ],
)
def test_n_an_engine_cannot_sample_is_refused_naming_n(
    triton_server: TritonServer, model: str, sampling: dict, rule: str
) -> None:
    _need(triton_server, model)
    result = stream(triton_server.grpc_url, model, llm_inputs("Once", sampling, stream=False))
    assert result.error is not None and "sampling_parameters.n:" in str(result.error)
    assert rule in str(result.error)
