"""tritonforge.openai without a server: body → schema tensors, outputs → OpenAI, errors.

The routes run on FastAPI's test client with a fake gateway that replays scripted model
responses, so SSE framing, usage, the max_tokens fit and error statuses are checked
here; the real stack is tests/e2e/test_openai.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tritonforge.openai import translate
from tritonforge.openai.app import create_app
from tritonforge.openai.errors import OpenAIError, from_triton, model_not_found
from tritonforge.openai.protocol import ChatCompletionRequest, CompletionRequest
from tritonforge.openai.responses import (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CompletionChunk,
    ErrorResponse,
    ModelList,
    OpenAIObject,
    to_json,
)
from tritonforge.openai.translate import ModelOutput, ModelSpec, TritonRequest, Usage
from tritonforge.triton.tensors import LLM_INPUTS

SCHEMA_INPUTS = frozenset(spec["name"] for spec in LLM_INPUTS)  # the shared schema
OUTPUTS = frozenset({"text_output", "finish_reason", "logprobs", "num_input_tokens"})
LLM = ModelSpec("llm", SCHEMA_INPUTS, OUTPUTS | {"num_output_tokens", "output_ids"})
TEXT_ONLY = ModelSpec(  # ensemble_vllm's shape: a text prompt, no messages, no ids
    "ens",
    frozenset({"text_input", "sampling_parameters", "stream", "return_finish_reason"}),
    OUTPUTS,
)
USER = [{"role": "user", "content": "hi"}]


def chat(**body: Any) -> TritonRequest:
    return translate.chat_request(
        ChatCompletionRequest.model_validate({"model": "llm", "messages": USER, **body}), LLM, 99
    )


def completion(spec: ModelSpec = LLM, **body: Any) -> TritonRequest:
    return translate.completion_request(
        CompletionRequest.model_validate({"model": "llm", "prompt": "Once", **body}), spec
    )


def wire(obj: OpenAIObject | None) -> Any:
    """``obj`` as the frontend writes it, read back."""
    assert obj is not None
    return json.loads(to_json(obj))


def error_of(call: Any) -> OpenAIError:
    with pytest.raises(OpenAIError) as caught:
        call()
    return caught.value


# --- request translation -------------------------------------------------------------


def test_chat_messages_become_the_messages_input_with_every_count_asked_for() -> None:
    request = chat(
        messages=[
            {"role": "developer", "content": "Be brief."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {"role": "assistant", "content": "ok", "name": "bot"},
        ],
        stream=True,
    )
    assert request.prompt_input == "messages"
    assert json.loads(str(request.prompt)) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "ok", "name": "bot"},
    ]
    assert request.flags == {
        "stream": True,
        "exclude_input_in_output": True,
        "return_finish_reason": True,
        "return_num_input_tokens": True,
        "return_num_output_tokens": True,
    }


def test_sampling_keys_and_vllm_extras_pass_through_unknown_keys_do_not() -> None:
    request = chat(
        temperature=0,
        top_p=0.5,
        stop=["\n", "."],
        seed=7,
        presence_penalty=0.1,
        frequency_penalty=0.2,
        top_k=5,
        min_p=0.1,
        repetition_penalty=1.1,
        ignore_eos=True,
        min_tokens=2,
        timeout_s=30,
        user="someone",
        metadata={"a": "b"},
        max_tokens=12,
    )
    assert request.sampling == {
        "temperature": 0,
        "top_p": 0.5,
        "stop": ["\n", "."],
        "seed": 7,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
        "top_k": 5,
        "min_p": 0.1,
        "repetition_penalty": 1.1,
        "ignore_eos": True,
        "min_tokens": 2,
        "timeout_s": 30,
        "max_tokens": 12,
    }
    assert not request.default_max_tokens


def test_max_completion_tokens_wins_and_a_missing_one_is_this_servers_default() -> None:
    assert chat(max_tokens=5, max_completion_tokens=9).sampling["max_tokens"] == 9
    defaulted = chat()
    assert defaulted.sampling["max_tokens"] == 99 and defaulted.default_max_tokens
    assert "max_tokens" not in completion().sampling  # completions: the model's 16, as OpenAI


def test_a_defaulted_max_tokens_is_lowered_once_to_what_the_model_says_fits() -> None:
    message = (
        "sampling_parameters.max_tokens: prompt (2040 tokens) + max_tokens (99) exceeds the "
        "model's context of 2048 tokens; ask for at most 8 tokens"
    )
    request = chat()
    assert request.fit_max_tokens(message)
    assert request.sampling["max_tokens"] == 8
    assert not request.fit_max_tokens(message)  # once only
    assert not chat(max_tokens=99).fit_max_tokens(message)  # the client's own value stays


def test_response_format_becomes_structured_outputs() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    as_schema = chat(
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    )
    assert as_schema.sampling["structured_outputs"] == {"json": schema}
    as_object = chat(response_format={"type": "json_object"})
    assert as_object.sampling["structured_outputs"] == {"json_object": True}
    assert "structured_outputs" not in chat(response_format={"type": "text"}).sampling
    assert chat(guided_regex="[ab]+").sampling["structured_outputs"] == {"regex": "[ab]+"}
    # vLLM's server keeps structured_outputs' options under a response_format.
    compact = chat(
        response_format={"type": "json_object"},
        structured_outputs={"disable_any_whitespace": True, "regex": "x"},
    )
    assert compact.sampling["structured_outputs"] == {
        "json_object": True,
        "disable_any_whitespace": True,
    }
    missing = error_of(lambda: chat(response_format={"type": "json_schema", "json_schema": {}}))
    assert missing.status == 400 and missing.param == "response_format"


def test_logprobs_ask_for_ids_too_so_the_sampled_token_is_known() -> None:
    request = chat(logprobs=True, top_logprobs=3)
    assert request.sampling["logprobs"] == 3 and request.top_logprobs == 3
    assert request.flags["return_logprobs"] and request.flags["return_output_ids"]
    assert chat(logprobs=True).sampling["logprobs"] == 0
    assert completion(logprobs=2).sampling["logprobs"] == 2
    assert error_of(lambda: chat(top_logprobs=2)).param == "top_logprobs"
    assert error_of(lambda: chat(logprobs=True, top_logprobs=21)).param == "top_logprobs"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"logit_bias": {"1": 5}}, "logit_bias"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
    ],
)
def test_what_this_server_cannot_do_is_a_400_naming_the_key(body: dict, param: str) -> None:
    error = error_of(lambda: chat(**body))
    assert (error.status, error.param) == (400, param)


def test_completion_prompt_forms() -> None:
    assert completion().prompt_input == "text_input"
    ids = completion(prompt=[1, 2, 3])
    assert (ids.prompt_input, ids.prompt) == ("input_ids", [1, 2, 3])
    assert completion(prompt=["one"]).prompt == "one"
    assert completion(prompt=[[4, 5]]).prompt == [4, 5]
    assert error_of(lambda: completion(prompt=["a", "b"])).param == "prompt"
    assert completion(echo=True).echo == "Once"


def test_a_model_without_an_input_gets_a_400_that_says_which() -> None:
    no_chat = error_of(
        lambda: translate.chat_request(
            ChatCompletionRequest.model_validate({"model": "ens", "messages": USER}), TEXT_ONLY, 9
        )
    )
    assert no_chat.status == 400 and "no `messages` input" in no_chat.message
    assert "no `input_ids` input" in error_of(lambda: completion(TEXT_ONLY, prompt=[1])).message
    # Flags the model does not declare are not sent (Triton would refuse the request).
    assert completion(TEXT_ONLY).flags == {"stream": False, "return_finish_reason": True}


def test_only_models_with_a_prompt_sampling_and_text_are_llm_models() -> None:
    assert LLM.is_llm and TEXT_ONLY.is_llm
    guard = ModelSpec("guard", frozenset({"text_input"}), frozenset({"text_output", "findings"}))
    preprocessing = ModelSpec("pre", frozenset({"text_input"}), frozenset({"input_ids"}))
    assert not guard.is_llm and not preprocessing.is_llm


# --- outputs -------------------------------------------------------------------------

CANDIDATES = [
    {
        "7": {"logprob": -0.5, "rank": 1, "decoded_token": "He"},
        "9": {"logprob": -1.5, "rank": 2, "decoded_token": "Hi"},
    },
    {  # the sampled token (3) ranks below the top-1 candidate; the engine lists it first
        "3": {"logprob": -2.0, "rank": 3, "decoded_token": "llo"},
        "4": {"logprob": -0.1, "rank": 1, "decoded_token": "y"},
    },
]


def test_chat_logprobs_take_the_sampled_token_by_its_id_and_rank_the_rest() -> None:
    output = ModelOutput(logprobs=CANDIDATES, output_ids=[7, 3])
    content = wire(translate.chat_logprobs(output, top=1))["content"]
    assert [(c["token"], c["logprob"]) for c in content] == [("He", -0.5), ("llo", -2.0)]
    assert content[1]["top_logprobs"] == [{"token": "y", "logprob": -0.1, "bytes": [121]}]
    assert content[0]["bytes"] == [72, 101]


def test_completion_logprobs_are_parallel_lists_with_offsets_after_the_echo() -> None:
    output = ModelOutput(logprobs=CANDIDATES)  # no ids (ensemble_vllm): the first candidate
    logprobs = wire(translate.completion_logprobs(output, text_offset=4))
    assert logprobs["tokens"] == ["He", "llo"]
    assert logprobs["token_logprobs"] == [-0.5, -2.0]
    assert logprobs["text_offset"] == [4, 6]
    assert logprobs["top_logprobs"][1] == {"y": -0.1, "llo": -2.0}


def test_usage_sums_streamed_counts_and_is_null_when_the_model_cannot_count() -> None:
    usage = Usage()
    for count in (1, 1, 2):
        usage.add(ModelOutput(num_input_tokens=5, num_output_tokens=count))
    assert wire(usage.report()) == {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}
    assert Usage().report() is None


def test_finish_reasons() -> None:
    assert translate.finish_reason("None") is None  # a streamed, non-final response
    assert translate.finish_reason("length") == "length"
    assert translate.finish_reason("stop") == "stop"
    assert translate.finish_reason("abort") == "stop"


# --- errors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "status", "param"),
    [
        ("sampling_parameters.top_p: must be in (0, 1], got 5", 400, "top_p"),
        (
            "sampling_parameters.structured_outputs.json: expected a JSON schema object",
            400,
            "response_format",
        ),
        ("text_input: prompt is 2100 tokens; the model's context is 2048 tokens", 400, "prompt"),
        ("messages[0].role: must be one of ('system',), got 'x'", 400, "messages[0].role"),
        ("vllm_model: text_input: prompt is 3000 tokens; the model's context", 400, "prompt"),
        ("unexpected inference input 'foo' for model 'llamacpp_model'", 400, None),
        ("[request id: <id_unknown>] expected 1 inputs but got 0 inputs for model 'm'", 400, None),
        ("Request for unknown model: 'nope' is not found", 404, "model"),
        ("model is busy: 8 requests in flight (max_inflight); retry later", 503, None),
        ("guarded_chat is busy: 64 requests in flight (max_inflight); retry later", 503, None),
        ("deadline exceeded: the request ran longer than its timeout_s of 0.5 s", 503, None),
        ("the engine failed (process died); the model is being restarted", 503, None),
        ("the model is unloading; no new requests are accepted", 503, None),
        ("something nobody expected went wrong", 500, None),
    ],
)
def test_triton_errors_map_to_statuses(message: str, status: int, param: str | None) -> None:
    error = from_triton(message, "m")
    assert (error.status, error.param) == (status, param)
    if status == 400:
        assert error.message == message  # the model's field-naming message, unchanged
    assert set(wire(error.body())["error"]) == {"message", "type", "param", "code"}


# --- routes, with a fake gateway -------------------------------------------------------


class FakeStream:
    def __init__(self, outputs: list[ModelOutput | OpenAIError]) -> None:
        self.outputs = list(outputs)
        self.cancelled = False

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> ModelOutput:
        if not self.outputs:
            raise StopAsyncIteration
        item = self.outputs.pop(0)
        if isinstance(item, OpenAIError):
            raise item
        return item

    def cancel(self) -> None:
        self.cancelled = True


class FakeGateway:
    """Answers each request with the next script; records what was sent."""

    url = "fake:1"

    def __init__(self, *scripts: list[ModelOutput | OpenAIError]) -> None:
        self.scripts = list(scripts)
        self.sent: list[TritonRequest] = []
        self.streams: list[FakeStream] = []

    async def spec(self, model: str, kind: str = "llm") -> ModelSpec:
        if model != "llm":
            raise model_not_found(model)
        return LLM

    async def served_models(self) -> list[str]:
        return ["llm"]

    async def server_ready(self) -> bool:
        return True

    async def close(self) -> None:
        pass

    def stream(self, model: str, request: TritonRequest) -> FakeStream:
        self.sent.append(json.loads(json.dumps(request.sampling)))  # a snapshot
        self.streams.append(FakeStream(self.scripts.pop(0)))
        return self.streams[-1]


def deltas() -> list[ModelOutput]:
    return [
        ModelOutput("Hel", "None", 4, 1),
        ModelOutput("lo", "None", 4, 1),
        ModelOutput("", "length", 4, 1, final=True),
    ]


def client(gateway: FakeGateway) -> TestClient:
    return TestClient(create_app("fake:1", 99, gateway=gateway))  # type: ignore[arg-type]


def sse_events(text: str) -> list[str]:
    return [e.removeprefix("data: ") for e in text.split("\n\n") if e]


def test_streamed_chat_is_openai_sse_with_usage_last_and_done() -> None:
    gateway = FakeGateway(deltas())
    body = {"model": "llm", "messages": USER, "stream": True}
    body["stream_options"] = {"include_usage": True}
    reply = client(gateway).post("/v1/chat/completions", json=body)
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = sse_events(reply.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "Hello"
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None, None, None, "length"]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    assert all(c["usage"] is None for c in chunks[:-1])


def test_non_streamed_completion_merges_the_responses() -> None:
    reply = client(FakeGateway(deltas())).post(
        "/v1/completions", json={"model": "llm", "prompt": "x", "echo": True}
    )
    answer = reply.json()
    assert answer["object"] == "text_completion"
    assert answer["choices"][0]["text"] == "xHello"
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 3


def test_error_before_the_first_token_keeps_its_status_even_when_streamed() -> None:
    busy = OpenAIError(503, "model is busy", "server_error")
    gateway = FakeGateway([busy])
    reply = client(gateway).post(
        "/v1/completions", json={"model": "llm", "prompt": "x", "stream": True}
    )
    assert reply.status_code == 503 and reply.json()["error"]["message"] == "model is busy"


def test_an_error_mid_stream_is_an_error_event_then_done() -> None:
    failure = from_triton("the engine failed (died); the model is being restarted", "llm")
    gateway = FakeGateway([ModelOutput("a", "None", 1, 1), failure])
    reply = client(gateway).post(
        "/v1/completions", json={"model": "llm", "prompt": "x", "stream": True}
    )
    events = sse_events(reply.text)
    assert json.loads(events[-2])["error"]["message"].startswith("the engine failed")
    assert events[-1] == "[DONE]"
    assert gateway.streams[0].cancelled or not gateway.streams[0].outputs


def test_the_defaulted_max_tokens_is_retried_with_what_fits() -> None:
    too_long = from_triton(
        "sampling_parameters.max_tokens: prompt (2040 tokens) + max_tokens (99) exceeds the "
        "model's context of 2048 tokens; ask for at most 8 tokens",
        "llm",
    )
    gateway = FakeGateway([too_long], deltas())
    reply = client(gateway).post("/v1/chat/completions", json={"model": "llm", "messages": USER})
    assert reply.status_code == 200
    assert [s["max_tokens"] for s in gateway.sent] == [99, 8]


@pytest.mark.parametrize(
    ("raw", "status", "fragment"),
    [
        (b'{"model": "llm", ', 400, "not valid JSON"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (b'{"model": "llm"}', 400, "prompt"),
        (b'{"model": "nope", "prompt": "x"}', 404, "nope"),
        (b'{"model": "llm", "prompt": "x", "best_of": 3}', 400, "best_of"),
        (b'{"model": "llm", "prompt": {"a": 1}}', 400, "prompt"),
    ],
)
def test_bad_bodies_are_openai_errors_never_500(raw: bytes, status: int, fragment: str) -> None:
    reply = client(FakeGateway()).post("/v1/completions", content=raw)
    assert reply.status_code == status
    assert fragment in reply.json()["error"]["message"]


def with_logprobs() -> list[ModelOutput]:
    first, second = CANDIDATES
    return [
        ModelOutput("He", "None", 4, 1, logprobs=[first], output_ids=[7]),
        ModelOutput("llo", "length", 4, 1, logprobs=[second], output_ids=[3], final=True),
    ]


def conforms(event: str, model: type[OpenAIObject]) -> dict[str, Any]:
    """The event read as ``model``: no key it lacks, none missing, absent stays absent."""
    sent = json.loads(event)
    assert wire(model.model_validate_json(event)) == sent
    return sent


@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize(
    ("path", "body", "chunk"),
    [
        (
            "/v1/chat/completions",
            {"messages": USER, "logprobs": True, "top_logprobs": 2},
            ChatCompletionChunk,
        ),
        ("/v1/completions", {"prompt": "x", "echo": True, "logprobs": 2}, CompletionChunk),
    ],
)
def test_every_streamed_chunk_is_the_typed_chunk_on_the_wire(
    path: str, body: dict[str, Any], chunk: type[OpenAIObject], include_usage: bool
) -> None:
    """The contract a faster writer of chunks is checked against: the response models."""
    body = {"model": "llm", "stream": True, **body}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    reply = client(FakeGateway(with_logprobs())).post(path, json=body)
    events = sse_events(reply.text)
    assert events[-1] == "[DONE]"
    sent = [conforms(event, chunk) for event in events[:-1]]
    assert all(("usage" in c) == include_usage for c in sent)
    assert any(c["choices"] and c["choices"][0]["logprobs"] for c in sent)


def test_whole_answers_models_and_errors_are_the_typed_objects_on_the_wire() -> None:
    test_client = client(FakeGateway(with_logprobs(), with_logprobs()))
    chat_body = {"model": "llm", "messages": USER, "logprobs": True, "top_logprobs": 1}
    answer = test_client.post("/v1/chat/completions", json=chat_body)
    conforms(answer.text, ChatCompletion)
    text_body = {"model": "llm", "prompt": "x", "logprobs": 1}
    conforms(test_client.post("/v1/completions", json=text_body).text, Completion)
    conforms(test_client.get("/v1/models").text, ModelList)
    conforms(test_client.post("/v1/completions", content=b"[").text, ErrorResponse)


def test_models_and_health() -> None:
    test_client = client(FakeGateway())
    assert [m["id"] for m in test_client.get("/v1/models").json()["data"]] == ["llm"]
    assert test_client.get("/health").json() == {"status": "ok"}
    assert test_client.get("/v1/nothing").json()["error"]["type"] == "not_found_error"


# --- the gRPC side's parsing ------------------------------------------------------------


def test_a_triton_response_is_read_straight_from_its_protobuf() -> None:
    import numpy as np
    from tritonclient.grpc import service_pb2
    from tritonclient.utils import serialize_byte_tensor

    from tritonforge.openai.triton_client import parse_response

    def text(value: str) -> bytes:
        return serialize_byte_tensor(np.array([value.encode()], dtype=np.object_)).item()

    response = service_pb2.ModelInferResponse()
    tensors = {
        "text_output": ("BYTES", text("Grüße")),
        "finish_reason": ("BYTES", text("length")),
        "num_input_tokens": ("UINT32", np.array([7], dtype=np.uint32).tobytes()),
        "num_output_tokens": ("UINT32", np.array([2], dtype=np.uint32).tobytes()),
        "logprobs": ("BYTES", text(json.dumps(CANDIDATES))),
        "output_ids": ("INT32", np.array([7, 3], dtype=np.int32).tobytes()),
    }
    for name, (datatype, raw) in tensors.items():
        response.outputs.add(name=name, datatype=datatype)
        response.raw_output_contents.append(raw)
    response.parameters["triton_final_response"].bool_param = True
    output = parse_response(response)
    assert (output.text, output.finish_reason, output.final) == ("Grüße", "length", True)
    assert (output.num_input_tokens, output.num_output_tokens) == (7, 2)
    assert output.logprobs == CANDIDATES and output.output_ids == [7, 3]

    bare = service_pb2.ModelInferResponse()  # a model without the optional outputs
    bare.outputs.add(name="text_output", datatype="BYTES")
    bare.raw_output_contents.append(text(""))
    parsed = parse_response(bare)
    assert parsed.text == "" and parsed.finish_reason is None and not parsed.final


def test_token_ids_outside_int32_are_a_400_naming_the_prompt() -> None:
    from tritonforge.openai.triton_client import request_inputs

    request = completion(prompt=[1, 2**31])
    with pytest.raises(OpenAIError) as caught:
        request_inputs(request)
    assert (caught.value.status, caught.value.param) == (400, "prompt")
    names = [t.name() for t in request_inputs(completion(prompt=[1, 2]))]
    assert names[:2] == ["input_ids", "sampling_parameters"]
