"""Cross-engine conformance: one suite, every engine that runs here, the same answers.

Each test runs once per model in ENGINES that the session server loaded (vLLM and
llama.cpp on these machines; tensorrt_llm_model on a GPU machine, see docker/). It
pins down the contract a client relies on when it switches engines: the same inputs,
outputs, errors and semantics (streaming, stop strings, limits, seeds, cancellation).
Texts are never compared across engines: llama.cpp and vLLM hold the same weights but
multiply them with different kernels (and vLLM in float32 on hosts without native
bfloat16), so their greedy answers differ.
"""

from __future__ import annotations

import json
import re
import time

import jsonschema
import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from transformers import AutoTokenizer

from tests.e2e.client import (
    LONG_GREEDY,
    bool_input,
    bytes_input,
    compact_json_budget,
    generate,
    generate_stream_text,
    llm_inputs,
    requests_cancelled,
    requests_running,
    stream,
    wait_for,
)
from tritonforge.launch.model_store import DEFAULT_MODEL_NAME, models_dir

#: Model name -> metric prefix of its engine.
ENGINES = {"vllm_model": "vllm", "llamacpp_model": "llamacpp", "tensorrt_llm_model": "trtllm"}
GREEDY = {"temperature": 0, "max_tokens": 16}
PROMPT = "The three primary colours are"
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
}

pytestmark = pytest.mark.server


@pytest.fixture(scope="module", params=list(ENGINES))
def model(request, triton_server) -> str:
    name = request.param
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    try:
        if not client.is_model_ready(name):
            pytest.skip(f"{name} is not loaded on this machine")
    finally:
        client.close()
    return name


@pytest.fixture(scope="module")
def server(triton_server):
    return triton_server


def run(server, model: str, prompt: str | None = PROMPT, **kwargs):
    """One gRPC request (streamed unless stream=False); fails the test on an error."""
    result = stream(server.grpc_url, model, llm_inputs(prompt, **kwargs))
    assert result.error is None, result.error
    return result


def single(result, name: str):
    (response,) = result.responses
    return response.as_numpy(name)


# --- schema --------------------------------------------------------------------------


def test_every_output_has_the_same_name_type_and_meaning(server, model: str) -> None:
    result = run(
        server,
        model,
        sampling={"temperature": 0, "max_tokens": 5, "ignore_eos": True, "logprobs": 2},
        stream=False,
        return_finish_reason=True,
        return_cumulative_logprob=True,
        return_logprobs=True,
        return_num_input_tokens=True,
        return_num_output_tokens=True,
        return_output_ids=True,
    )
    (response,) = result.responses
    assert response.as_numpy("text_output").dtype == np.object_
    assert response.as_numpy("finish_reason")[0] == b"length"
    assert response.as_numpy("num_output_tokens").dtype == np.uint32
    assert response.as_numpy("num_output_tokens")[0] == 5
    assert response.as_numpy("num_input_tokens")[0] > 3
    ids = response.as_numpy("output_ids")
    assert ids.dtype == np.int32 and len(ids) == 5
    logprobs = json.loads(response.as_numpy("logprobs")[0])
    assert len(logprobs) == 5
    for token, position in zip(ids.tolist(), logprobs, strict=True):
        # The sampled token plus the two most likely ones, each with rank and text.
        assert str(token) in position and 1 <= len(position) <= 3
        assert all(set(e) == {"logprob", "rank", "decoded_token"} for e in position.values())
    cumulative = response.as_numpy("cumulative_logprob")
    assert cumulative.dtype == np.float32
    expected = sum(position[str(t)]["logprob"] for t, position in zip(ids, logprobs, strict=True))
    assert cumulative[0] == pytest.approx(expected, rel=1e-3, abs=1e-3)


@pytest.mark.numerics
def test_non_streamed_text_echoes_the_prompt_unless_excluded(server, model: str) -> None:
    body = {"text_input": PROMPT, "parameters": GREEDY}
    echoed = generate(server.http_url, model, body)["text_output"]
    bare = generate(server.http_url, model, {**body, "exclude_input_in_output": True})
    assert echoed == PROMPT + bare["text_output"] and bare["text_output"]


# --- streaming -----------------------------------------------------------------------


@pytest.mark.numerics
@pytest.mark.parametrize(
    "prompt", [PROMPT, "Écris une phrase en français sur l'été:", "日本の首都は"]
)
def test_stream_concatenation_equals_the_non_streamed_text(server, model: str, prompt) -> None:
    sampling = {"temperature": 0, "max_tokens": 24}
    whole = run(server, model, prompt, sampling=sampling, stream=False).text
    streamed = run(server, model, prompt, sampling=sampling)
    assert len(streamed.responses) > 1  # really streamed
    assert streamed.text == whole
    sse = generate_stream_text(
        server.http_url, model, {"text_input": prompt, "stream": True, "parameters": sampling}
    )
    assert sse == whole


# --- chat template -------------------------------------------------------------------


@pytest.mark.numerics
def test_messages_are_rendered_with_the_models_chat_template(server, model: str) -> None:
    """A chat request equals a text request of the template rendered by HF transformers."""
    tokenizer = AutoTokenizer.from_pretrained(models_dir() / DEFAULT_MODEL_NAME)
    rendered = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    expected_tokens = len(tokenizer.encode(rendered, add_special_tokens=False))
    chat = run(server, model, None, messages=CHAT, sampling=GREEDY, stream=False,
               return_num_input_tokens=True)  # fmt: skip
    text = run(server, model, rendered, sampling=GREEDY, stream=False)
    assert single(chat, "num_input_tokens")[0] == expected_tokens
    assert chat.text == text.text and chat.text.strip()


# --- structured output ---------------------------------------------------------------


@pytest.mark.numerics
@pytest.mark.parametrize(
    ("constraint", "check"),
    [
        ({"choice": ["yes", "no"]}, lambda t: t in ("yes", "no") or pytest.fail(t)),
        (
            {"regex": "[0-9]{3}-[0-9]{4}"},
            lambda t: (
                (len(t) == 8 and t[3] == "-" and t.replace("-", "").isdigit()) or pytest.fail(t)
            ),
        ),
    ],
)
def test_structured_output_follows_the_constraint(server, model: str, constraint, check) -> None:
    messages = [{"role": "user", "content": "Describe a person, or answer yes or no."}]
    sampling = {"temperature": 0, "max_tokens": 48, "structured_outputs": constraint}
    for streamed in (False, True):
        result = run(server, model, None, messages=messages, sampling=sampling, stream=streamed)
        check(result.text)


@pytest.mark.numerics
def test_json_schema_output_validates(server, model: str) -> None:
    """A JSON schema constrains the answer to JSON that validates against it.

    Without ``disable_any_whitespace`` vLLM's JSON grammar allows any whitespace
    between tokens, and on some CPUs the greedy 135M model then writes newlines until
    max_tokens; compact JSON and bounded fields make the answer finish on any numerics.
    """
    messages = [{"role": "user", "content": "Describe a person as JSON."}]
    constraint = {"json": PERSON_SCHEMA, "disable_any_whitespace": True}
    budget = compact_json_budget({"name": "x" * 24, "age": 150})
    sampling = {"temperature": 0, "max_tokens": budget, "structured_outputs": constraint}
    for streamed in (False, True):
        result = run(
            server, model, None, messages=messages, sampling=sampling, stream=streamed,
            return_finish_reason=True,
        )  # fmt: skip
        assert result.outputs("finish_reason")[-1][0] == b"stop", result.text
        jsonschema.validate(json.loads(result.text), PERSON_SCHEMA)


# --- stop strings, max_tokens, seeds ---------------------------------------------------


@pytest.mark.numerics
def test_stop_string_ends_the_text_at_the_same_place_streamed_or_not(server, model) -> None:
    sampling = {"temperature": 0, "max_tokens": 24, "ignore_eos": True}
    reference = run(server, model, sampling=sampling, stream=False).text
    words = reference.split()
    assert len(words) >= 4, reference
    stop = words[len(words) // 2]
    cut = reference.index(stop)
    stopped = {**sampling, "stop": [stop]}
    for streamed in (False, True):
        result = run(server, model, sampling=stopped, stream=streamed, return_finish_reason=True)
        assert result.text == reference[:cut]
        assert result.outputs("finish_reason")[-1][0] == b"stop"
    kept = run(server, model, sampling={**stopped, "include_stop_str_in_output": True})
    assert kept.text == reference[: cut + len(stop)]


def test_max_tokens_is_respected_exactly(server, model: str) -> None:
    sampling = {"temperature": 0, "max_tokens": 7, "ignore_eos": True}
    for streamed in (False, True):
        result = run(
            server,
            model,
            sampling=sampling,
            stream=streamed,
            return_num_output_tokens=True,
            return_finish_reason=True,
        )
        assert sum(int(n[0]) for n in result.outputs("num_output_tokens")) == 7
        assert result.outputs("finish_reason")[-1][0] == b"length"


@pytest.mark.numerics
def test_same_seed_same_sample(server, model: str) -> None:
    # min_tokens: a sampled answer may otherwise be an immediate end of sequence.
    sampling = {"temperature": 1.0, "top_p": 0.95, "max_tokens": 16, "min_tokens": 8, "seed": 1234}
    first = run(server, model, sampling=sampling, stream=False).text
    again = run(server, model, sampling=sampling).text
    assert first == again and first
    others = {run(server, model, sampling={**sampling, "seed": s}, stream=False).text
              for s in (1, 2, 3)}  # fmt: skip
    assert len(others | {first}) > 1  # the seed really drives the sampler


# --- cancellation ----------------------------------------------------------------------


@pytest.mark.speed
def test_cancelled_stream_stops_the_engine_work(server, model: str) -> None:
    def cancelled() -> float:
        return requests_cancelled(server.metrics_url, ENGINES[model], model)

    def running() -> float:
        return _running(server, model)

    wait_for(lambda: running() == 0, what="an idle engine")
    before = cancelled()
    result = stream(server.grpc_url, model, llm_inputs(PROMPT, sampling=LONG_GREEDY), stop_after=3)
    assert len(result.responses) == 3
    wait_for(lambda: cancelled() == before + 1, what="the request to be counted cancelled")
    wait_for(lambda: running() == 0, what="the engine's running count to return to 0")
    assert run(server, model, sampling=GREEDY, stream=False).text  # still serving


# --- limits: the context, the deadline -------------------------------------------------

OVER_CONTEXT = re.compile(
    r"sampling_parameters\.max_tokens: prompt \((\d+) tokens\) \+ max_tokens \((\d+)\) "
    r"exceeds the model's context of (\d+) tokens"
)


def ids_inputs(
    ids: list[int], sampling: dict, stream_: bool = False
) -> list[grpcclient.InferInput]:
    """A token-id request (the prompt's length is exact, whatever the engine)."""
    tensor = grpcclient.InferInput("input_ids", [len(ids)], "INT32")
    tensor.set_data_from_numpy(np.array(ids, dtype=np.int32))
    return [
        tensor,
        bytes_input("sampling_parameters", json.dumps(sampling)),
        bool_input("stream", stream_),
        bool_input("return_finish_reason", True),
    ]


def test_prompt_plus_max_tokens_beyond_the_context_is_refused_naming_both(server, model) -> None:
    refused = stream(server.grpc_url, model, llm_inputs(PROMPT, sampling={"max_tokens": 100000}))
    # A decoupled model's error reaches a gRPC stream client as a message only (Triton
    # 2.51 sends no status code on the stream): the message is what clients can act on.
    assert refused.error is not None
    found = OVER_CONTEXT.search(refused.error.message())
    assert found and found.group(2) == "100000", refused.error.message()
    context = int(found.group(3))
    # A prompt that leaves 8 tokens of room: 9 is refused, and so is the default (16).
    tokenizer = AutoTokenizer.from_pretrained(models_dir() / DEFAULT_MODEL_NAME)
    ids = tokenizer.encode(" word", add_special_tokens=False)[:1] * (context - 8)
    for sampling, asked in (({"max_tokens": 9}, 9), ({}, 16)):
        over = stream(server.grpc_url, model, ids_inputs(ids, sampling))
        assert over.error is not None, sampling
        found = OVER_CONTEXT.search(over.error.message())
        assert found, over.error.message()
        assert [int(n) for n in found.groups()] == [context - 8, asked, context]
    # Exactly filling the context is accepted (the rule is not off by one): a short prompt
    # whose max_tokens reaches the context's last position streams its first token; one
    # more is refused. Filling it with the prompt instead costs a ~2,040-token prefill
    # (about 2 minutes in bf16 on a 2-core AVX2 host), so the request is cancelled once
    # its first token proves both our check and the engine took it.
    short = ids[:8]
    over = stream(server.grpc_url, model, ids_inputs(short, {"max_tokens": context - 7}))
    assert over.error is not None
    found = OVER_CONTEXT.search(over.error.message())
    assert found and [int(n) for n in found.groups()] == [8, context - 7, context]
    wait_for(lambda: _running(server, model) == 0, what="an idle engine")
    filling = {"max_tokens": context - 8, "ignore_eos": True}
    full = stream(server.grpc_url, model, ids_inputs(short, filling, stream_=True), stop_after=1)
    assert full.error is None, full.error
    assert len(single(full, "output_ids")) >= 1
    wait_for(lambda: _running(server, model) == 0, what="the cancelled request to end")
    assert run(server, model, sampling=GREEDY, stream=False).text  # still serving


def _running(server, model: str) -> float:
    return requests_running(server.metrics_url, ENGINES[model], model)


@pytest.mark.speed
def test_timeout_s_ends_a_long_request_and_frees_the_engine(server, model: str) -> None:
    wait_for(lambda: _running(server, model) == 0, what="an idle engine")
    started = time.monotonic()
    result = stream(
        server.grpc_url, model, llm_inputs(PROMPT, sampling={**LONG_GREEDY, "timeout_s": 0.5})
    )
    assert time.monotonic() - started < 5
    assert result.error is not None  # a message only on a gRPC stream (see above)
    message = result.error.message()
    assert "deadline exceeded" in message and "timeout_s of 0.5 s" in message, message
    # The engine stopped generating (no client cancelled it: the error came first).
    wait_for(lambda: _running(server, model) == 0, timeout_s=10, what="running back to 0")
    assert run(server, model, sampling=GREEDY, stream=False).text  # still serving


@pytest.mark.speed
def test_timeout_s_ends_a_non_streamed_http_generate(server, model: str) -> None:
    """The remedy for a /generate client that leaves: Triton 2.51 never says it left."""
    body = {"text_input": PROMPT, "parameters": {**LONG_GREEDY, "timeout_s": 0.5}}
    started = time.monotonic()
    reply = requests.post(
        f"http://{server.http_url}/v2/models/{model}/generate", json=body, timeout=60
    )
    assert time.monotonic() - started < 5
    # Triton 2.51's /generate answers 400 to any model error, whatever its code.
    assert reply.status_code == 400 and "deadline exceeded" in reply.json()["error"], reply.text
    wait_for(lambda: _running(server, model) == 0, timeout_s=10, what="running back to 0")


@pytest.mark.speed
def test_tritons_request_timeout_is_the_same_deadline(server, model: str) -> None:
    """Triton's own ``timeout`` parameter (microseconds; tritonclient's ``timeout=``)."""
    wait_for(lambda: _running(server, model) == 0, what="an idle engine")
    started = time.monotonic()
    result = stream(
        server.grpc_url,
        model,
        llm_inputs(PROMPT, sampling={**LONG_GREEDY, "timeout_s": 60}),
        request_timeout_us=500_000,
    )
    assert time.monotonic() - started < 5
    assert result.error is not None  # a message only on a gRPC stream (see above)
    assert "Triton request timeout of 0.5 s" in result.error.message(), result.error.message()
    wait_for(lambda: _running(server, model) == 0, timeout_s=10, what="running back to 0")


# --- bad input -------------------------------------------------------------------------

LONG_PROMPT = "word " * 2100


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"text_input": "hi", "sampling_parameters": "{no"}, "sampling_parameters: is not valid"),
        ({"text_input": "hi", "parameters": {"nonsense": 1}}, "parameters.nonsense: unknown"),
        ({"text_input": "hi", "parameters": {"max_tokens": 0}}, "max_tokens: must be >= 1"),
        ({"text_input": "hi", "parameters": {"top_p": 1.5}}, "top_p: must be in (0, 1]"),
        ({"text_input": "hi", "parameters": {"n": 0}}, "n: must be in [1, 128]"),
        ({"text_input": "hi", "parameters": {"timeout_s": 0}}, "timeout_s: must be a positive"),
        ({"text_input": ""}, "text_input: must not be empty"),
        ({"text_input": LONG_PROMPT}, "text_input: prompt is"),
        ({"messages": '[{"role": "user"}]'}, "messages[0].content: must be a string"),
        ({"messages": '[{"role": "robot", "content": "x"}]'}, "messages[0].role: must be one"),
        (
            {"text_input": "hi", "sampling_parameters": json.dumps({"stop_token_ids": [10**6]})},
            "stop_token_ids[0]: token id 1000000 is out of range",
        ),
        (
            {"text_input": "hi", "sampling_parameters": '{"structured_outputs": {"json": "{"}}'},
            "structured_outputs.json: not valid JSON",
        ),
        (
            {"text_input": "hi", "stream": True, "exclude_input_in_output": False},
            "exclude_input_in_output: must be true",
        ),
    ],
)
def test_bad_input_gets_the_same_error_and_the_model_keeps_serving(
    server, model: str, body: dict, fragment: str
) -> None:
    reply = generate(server.http_url, model, body)
    assert fragment in reply.get("error", ""), reply
    ok = generate(server.http_url, model, {"text_input": "Hello", "parameters": {"max_tokens": 2}})
    assert "text_output" in ok, ok


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"text_input": ["a", "b"]}, "input 'text_input' to tensor with proper shape"),
        ({"text_input": "a", "stream": 3}, "non-boolean as boolean"),
    ],
)
def test_wrong_tensor_type_or_shape_is_rejected_by_triton(
    server, model: str, body: dict, fragment: str
) -> None:
    """Triton validates types and shapes against config.pbtxt before the model runs.

    Sent over HTTP: in Triton 2.51 a request that this validation rejects on a gRPC
    *stream* keeps its model from ever unloading (seen here; it never reaches the model).
    Triton 2.51 workaround W9, see docs/triton-2.51-workarounds.md.
    """
    reply = generate(server.http_url, model, body)
    assert fragment in reply.get("error", ""), reply
    assert grpcclient.InferenceServerClient(server.grpc_url).is_model_ready(model)
    ok = stream(
        server.grpc_url, model, [bytes_input("text_input", "Hi"), bool_input("stream", True)]
    )
    assert ok.error is None and ok.responses
