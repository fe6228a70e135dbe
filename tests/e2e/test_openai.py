"""The OpenAI-compatible API on the real stack, driven by the pinned ``openai`` SDK.

``python -m tritonforge.openai`` runs against the session's tritonserver. Expectations
are derived on this machine, never hard-coded: the OpenAI answer must equal the same
model's direct Triton answer to the same greedy request (text, token counts, finish
reason), and a stop string is cut from the model's own greedy text.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
import tritonclient.grpc as grpcclient

from tests.e2e.client import (
    Hold,
    compact_json_budget,
    llm_inputs,
    metric,
    model_ready,
    requests_cancelled,
    requests_running,
    stream,
    wait_for,
)
from tritonforge.launch.launcher import MODEL_REPOSITORY, OpenAIFrontend, TritonServer
from tritonforge.repo import pbtxt

pytestmark = pytest.mark.server

#: Loaded LLM models of the shared schema that run here → their engine's metric prefix.
ENGINES = {"vllm_model": "vllm", "llamacpp_model": "llamacpp"}
CHAT = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
]
PROMPT = "The three primary colours are"
#: The name is bounded, so a constrained greedy answer fits max_tokens whatever it picks.
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
}
COUNTS = {"return_finish_reason": True, "return_num_input_tokens": True}
COUNTS |= {"return_num_output_tokens": True}


@pytest.fixture(scope="module")
def client(frontend: OpenAIFrontend) -> openai.OpenAI:
    return openai.OpenAI(base_url=frontend.base_url, api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module", params=list(ENGINES))
def model(request, triton_server) -> str:
    if not model_ready(triton_server, request.param):
        pytest.skip(f"{request.param} is not loaded on this machine")
    return request.param


def direct(server: TritonServer, model: str, sampling: dict, **prompt) -> dict:
    """The same model's answer over Triton gRPC, non-streamed, with its counts."""
    text = prompt.pop("text", None)
    result = stream(server.grpc_url, model, llm_inputs(text, sampling, stream=False, **prompt))
    assert result.error is None, result.error
    (response,) = result.responses
    return {
        "text": result.text,
        "prompt_tokens": int(response.as_numpy("num_input_tokens")[0]),
        "completion_tokens": int(response.as_numpy("num_output_tokens").sum()),
        "finish_reason": b"".join(response.as_numpy("finish_reason")).decode(),
    }


def direct_chat(server, model, sampling) -> dict:
    return direct(server, model, sampling, messages=CHAT, **COUNTS)


def direct_text(server, model, sampling, prompt=PROMPT) -> dict:
    return direct(server, model, sampling, text=prompt, **COUNTS)


def usage_of(usage) -> dict:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens}


def counts_of(expected: dict) -> dict:
    return {k: expected[k] for k in ("prompt_tokens", "completion_tokens")}


# --- models and health ------------------------------------------------------------------


def test_models_lists_the_ready_llm_models_only(client, triton_server, frontend) -> None:
    ids = {m.id for m in client.models.list()}
    for name in (*ENGINES, "ensemble_vllm", "guarded_chat"):
        assert (name in ids) == model_ready(triton_server, name), (name, ids)
    assert not ids & {"guard", "preprocessing", "postprocessing"}  # text models, not LLMs
    assert httpx.get(frontend.base_url.removesuffix("/v1") + "/health").json() == {"status": "ok"}


# --- answers equal the model's own ---------------------------------------------------------


@pytest.mark.numerics
def test_chat_equals_the_models_direct_answer_streamed_or_not(client, triton_server, model):
    sampling = {"temperature": 0, "max_tokens": 24}
    expected = direct_chat(triton_server, model, sampling)
    answer = client.chat.completions.create(model=model, messages=CHAT, **sampling)
    choice = answer.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == expected["text"]
    assert choice.finish_reason == expected["finish_reason"]
    assert usage_of(answer.usage) == counts_of(expected)
    assert answer.usage.total_tokens == expected["prompt_tokens"] + expected["completion_tokens"]

    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=CHAT,
            stream=True,
            stream_options={"include_usage": True},
            **sampling,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected["text"]
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == expected["finish_reason"] and not any(reasons[:-1])
    assert chunks[-1].choices == [] and usage_of(chunks[-1].usage) == counts_of(expected)
    assert all(c.usage is None for c in chunks[:-1])


@pytest.mark.numerics
def test_completion_equals_the_models_direct_answer_streamed_or_not(client, triton_server, model):
    sampling = {"temperature": 0, "max_tokens": 16}
    expected = direct_text(triton_server, model, sampling)
    answer = client.completions.create(model=model, prompt=PROMPT, **sampling)
    assert answer.choices[0].text == expected["text"]
    assert answer.choices[0].finish_reason == expected["finish_reason"]
    assert usage_of(answer.usage) == counts_of(expected)
    chunks = list(
        client.completions.create(
            model=model,
            prompt=PROMPT,
            stream=True,
            stream_options={"include_usage": True},
            **sampling,
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected["text"]
    assert usage_of(chunks[-1].usage) == counts_of(expected)


@pytest.mark.numerics
def test_token_id_prompt_equals_the_models_direct_answer(client, triton_server, model) -> None:
    ids = [504, 1488, 3380, 6496, 359]
    sampling = {"temperature": 0, "max_tokens": 8}
    result = stream(
        triton_server.grpc_url,
        model,
        [
            *llm_inputs(None, sampling, stream=False, **COUNTS),
            _ids_input(ids),
        ],
    )
    assert result.error is None, result.error
    answer = client.completions.create(model=model, prompt=ids, **sampling)
    assert answer.choices[0].text == result.text
    assert answer.usage.prompt_tokens == len(ids)


def _ids_input(ids: list[int]) -> grpcclient.InferInput:
    import numpy as np

    tensor = grpcclient.InferInput("input_ids", [len(ids)], "INT32")
    tensor.set_data_from_numpy(np.array(ids, dtype=np.int32))
    return tensor


@pytest.mark.numerics
def test_stop_string_cuts_the_greedy_text_where_it_appears(client, triton_server, model) -> None:
    sampling = {"temperature": 0, "max_tokens": 24}
    full = direct_text(triton_server, model, {**sampling, "ignore_eos": True})["text"]
    words = full.split()
    assert len(words) >= 4, full
    stop = words[2]  # cut at the third word: what comes before it is known
    before = full[: full.index(stop)]
    for streamed in (False, True):
        if streamed:
            chunks = list(
                client.completions.create(
                    model=model,
                    prompt=PROMPT,
                    stop=[stop, "\u2603"],
                    stream=True,
                    extra_body={"ignore_eos": True},
                    **sampling,
                )
            )
            text = "".join(c.choices[0].text for c in chunks)
            reason = chunks[-1].choices[0].finish_reason
        else:
            answer = client.completions.create(
                model=model, prompt=PROMPT, stop=stop, extra_body={"ignore_eos": True}, **sampling
            )
            text, reason = answer.choices[0].text, answer.choices[0].finish_reason
        assert (text, reason) == (before, "stop")


def test_json_schema_answer_parses_and_validates(client, model) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}}
    answer = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        response_format=fmt,
        temperature=0,
        max_tokens=compact_json_budget({"name": "x" * 24, "age": 150}),
        # Compact, as vLLM's server takes it beside response_format: no free whitespace
        # to spend the budget on, so the bounded schema always closes within it.
        extra_body={"structured_outputs": {"disable_any_whitespace": True}},
    )
    jsonschema.validate(json.loads(answer.choices[0].message.content), PERSON_SCHEMA)
    as_object = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Describe a person as JSON."}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=64,
    )
    # json_object constrains the syntax, not the length: a greedy answer may run out of
    # tokens mid-object (finish_reason "length"); a finished one must parse.
    content = as_object.choices[0].message.content
    assert content.lstrip().startswith("{"), content
    if as_object.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)


def test_logprobs_have_openais_shape(client, model) -> None:
    answer = client.chat.completions.create(
        model=model, messages=CHAT, temperature=0, max_tokens=5, logprobs=True, top_logprobs=2
    )
    content = answer.choices[0].logprobs.content
    assert len(content) == answer.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
        # Greedy: the sampled token is the most likely one.
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob, abs=1e-4)
    legacy = client.completions.create(
        model=model, prompt=PROMPT, temperature=0, max_tokens=4, logprobs=1
    )
    lp = legacy.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == 4
    assert "".join(lp.tokens) == legacy.choices[0].text


def test_vllm_extras_in_the_body_reach_the_engine(client, model) -> None:
    answer = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=12,
        extra_body={"ignore_eos": True, "min_tokens": 12, "top_k": 1, "repetition_penalty": 1.0},
        user="ignored-by-design",
    )
    assert answer.usage.completion_tokens == 12 and answer.choices[0].finish_reason == "length"


# --- errors ------------------------------------------------------------------------------


def test_invalid_argument_is_a_400_with_the_models_field_naming_message(client, model) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=model, messages=CHAT, top_p=5, max_tokens=4)
    error = caught.value.body
    assert error["message"].startswith("sampling_parameters.top_p: must be in (0, 1]")
    assert error["param"] == "top_p" and error["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError, match=r"n: must be in \[1, 128\]"):
        client.completions.create(model=model, prompt=PROMPT, n=0)
    with pytest.raises(openai.BadRequestError, match="context"):  # streamed: still a 400
        client.completions.create(model=model, prompt="word " * 2100, max_tokens=4, stream=True)


def test_unknown_or_unloaded_model_is_a_404(client) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="no_such_model", prompt=PROMPT)
    assert caught.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):  # loaded, but not an LLM model
        client.completions.create(model="guard", prompt=PROMPT)


def test_malformed_bodies_are_400_never_500(frontend) -> None:
    url = frontend.base_url + "/chat/completions"
    for raw in (b'{"model": "vllm_model", ', b"[]", b'{"messages": []}', b"\xff"):
        reply = httpx.post(url, content=raw, headers={"content-type": "application/json"})
        assert reply.status_code == 400, (raw, reply.text)
        assert set(reply.json()["error"]) == {"message", "type", "param", "code"}


def test_a_full_queue_is_a_503(frontend, triton_server) -> None:
    """llamacpp_model admits max_inflight requests (slots decoding, the rest waiting);
    with that many holds in flight, one more is "busy"."""
    if not model_ready(triton_server, "llamacpp_model"):
        pytest.skip("llamacpp_model is not loaded on this machine")
    config = pbtxt.read(MODEL_REPOSITORY / "llamacpp_model" / "config.pbtxt")
    admitted = int(pbtxt.parameters(config)["max_inflight"])
    running, _ = _gauges(triton_server, "llamacpp_model")
    wait_for(lambda: running() == 0, what="an idle engine")
    holds = [Hold(triton_server.grpc_url, "llamacpp_model", f"Story {i}:") for i in range(admitted)]
    try:
        waiting = f"{ENGINES['llamacpp_model']}:num_requests_waiting"
        wait_for(
            lambda: (
                running() + metric(triton_server.metrics_url, waiting, model="llamacpp_model")
                == admitted
            ),
            what=f"{admitted} requests admitted",
        )
        body = {"model": "llamacpp_model", "prompt": PROMPT, "max_tokens": 4}
        reply = httpx.post(frontend.base_url + "/completions", json=body, timeout=60)
    finally:
        for hold in holds:
            hold.cancel()
    assert reply.status_code == 503, reply.text
    busy = reply.json()["error"]
    assert "busy" in busy["message"] and busy["type"] == "server_error"
    assert int(reply.headers["retry-after"]) > 0
    wait_for(lambda: running() == 0, what="the holds cancelled")


# --- cancellation and concurrency --------------------------------------------------------


def _gauges(server: TritonServer, model: str):
    def running() -> float:
        return requests_running(server.metrics_url, ENGINES[model], model)

    def cancelled() -> float:
        return requests_cancelled(server.metrics_url, ENGINES[model], model)

    return running, cancelled


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "non-streamed"])
@pytest.mark.speed
def test_a_client_that_disconnects_cancels_the_engine_request(
    frontend, triton_server, model, streamed: bool
) -> None:
    running, cancelled = _gauges(triton_server, model)
    wait_for(lambda: running() == 0, what="an idle engine")
    before = cancelled()
    body = {"model": model, "prompt": PROMPT, "max_tokens": 1500, "ignore_eos": True}
    body["stream"] = streamed
    url = frontend.base_url + "/completions"
    if streamed:
        with httpx.stream("POST", url, json=body, timeout=60) as reply:
            lines = reply.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
        # Leaving the block closes the connection mid-stream.
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url, json=body, timeout=httpx.Timeout(60, read=2))
    wait_for(lambda: cancelled() == before + 1, what="the request to be counted cancelled")
    wait_for(lambda: running() == 0, what="the engine's running gauge to return to 0")


@pytest.mark.speed
def test_sixteen_concurrent_streams(frontend, triton_server) -> None:
    if not model_ready(triton_server, "vllm_model"):
        pytest.skip("vllm_model is not loaded on this machine")
    client = openai.AsyncOpenAI(base_url=frontend.base_url, api_key="unused", max_retries=0)

    async def one(i: int) -> tuple[str, str | None, int]:
        chunks = await client.chat.completions.create(
            model="vllm_model",
            messages=[{"role": "user", "content": f"Count to {i + 3}."}],
            max_tokens=16,
            extra_body={"ignore_eos": True},
            stream=True,
            stream_options={"include_usage": True},
        )
        text, reason, tokens = "", None, -1
        async for chunk in chunks:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                reason = chunk.choices[0].finish_reason or reason
            elif chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return text, reason, tokens

    async def all_of_them():
        try:
            return await asyncio.gather(*(one(i) for i in range(16)))
        finally:
            await client.close()

    results = asyncio.run(all_of_them())
    assert len(results) == 16
    assert all(text and reason == "length" and tokens == 16 for text, reason, tokens in results)


# --- the other models of the schema --------------------------------------------------------


def test_pipelines_answer_through_the_same_api(client, triton_server) -> None:
    if model_ready(triton_server, "ensemble_vllm"):
        answer = client.completions.create(
            model="ensemble_vllm", prompt=PROMPT, temperature=0, max_tokens=8
        )
        expected = direct_text(triton_server, "vllm_model", {"temperature": 0, "max_tokens": 8})
        assert answer.choices[0].text == expected["text"]  # the ensemble's greedy = vllm_model's
        assert usage_of(answer.usage) == counts_of(expected)
        with pytest.raises(openai.BadRequestError, match="no `messages` input"):
            client.chat.completions.create(model="ensemble_vllm", messages=CHAT, max_tokens=4)
    if model_ready(triton_server, "guarded_chat"):
        sampling = {"temperature": 0, "max_tokens": 12}
        answer = client.chat.completions.create(model="guarded_chat", messages=CHAT, **sampling)
        expected = direct_chat(triton_server, "vllm_model", sampling)
        assert answer.choices[0].message.content == expected["text"]  # nothing to redact
        assert usage_of(answer.usage) == counts_of(expected)
        assert answer.choices[0].finish_reason == expected["finish_reason"]


def test_frontend_log_has_no_prompt_text(frontend) -> None:
    log = Path(frontend.log_path).read_text(errors="replace")
    assert "primary colours" not in log and "capital of France" not in log
