"""Request parsing and validation: pure logic, no server."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tritonforge.serving.errors import RequestError
from tritonforge.serving.sampling import SamplingParams, StructuredOutput
from tritonforge.serving.schema import parse_request


def text(value: str | bytes) -> np.ndarray:
    raw = value.encode() if isinstance(value, str) else value
    return np.array([raw], dtype=np.object_)


def flag(value: bool) -> np.ndarray:
    return np.array([value], dtype=bool)


def params(**values: object) -> np.ndarray:
    return text(json.dumps(values))


def error_of(inputs: dict, parameters: dict | None = None) -> RequestError:
    with pytest.raises(RequestError) as info:
        parse_request(inputs, parameters)
    return info.value


def test_defaults_follow_upstream_vllm_backend() -> None:
    request = parse_request({"text_input": text("Hello")})
    assert request.prompt == "Hello"
    assert request.stream is False
    assert request.prepend_input is True  # non-streamed text echoes the prompt
    assert request.sampling == SamplingParams()
    assert request.sampling.max_tokens == 16


def test_streaming_never_echoes_and_refuses_to_be_asked_to() -> None:
    assert parse_request({"text_input": text("x"), "stream": flag(True)}).prepend_input is False
    err = error_of(
        {"text_input": text("x"), "stream": flag(True), "exclude_input_in_output": flag(False)}
    )
    assert err.field == "exclude_input_in_output"


def test_genai_perf_sends_numbers_as_strings() -> None:
    request = parse_request(
        {
            "text_input": text("x"),
            "sampling_parameters": params(max_tokens="256", ignore_eos="true"),
        }
    )
    assert request.sampling.max_tokens == 256
    assert request.sampling.ignore_eos is True


def test_tensor_wins_over_request_parameters() -> None:
    request = parse_request(
        {"text_input": text("x"), "sampling_parameters": params(temperature=0)},
        {"temperature": 0.7, "top_p": 0.5},
    )
    assert request.sampling.temperature == 0.0
    assert request.sampling.top_p == 0.5


def test_transport_parameters_are_not_sampling_keys() -> None:
    request = parse_request(
        {"text_input": text("x")}, {"binary_data_output": True, "max_tokens": 3}
    )
    assert request.sampling.max_tokens == 3
    # /generate's "id" reaches the model as a parameter beside the request's id.
    assert parse_request({"text_input": text("x")}, {"id": "my-req-1"}).sampling.max_tokens


@pytest.mark.parametrize(
    ("values", "field", "rule"),
    [
        ({"max_tokens": 0}, "sampling_parameters.max_tokens", ">= 1"),
        ({"max_tokens": "ten"}, "sampling_parameters.max_tokens", "integer"),
        ({"max_tokens": [1]}, "sampling_parameters.max_tokens", "integer"),
        ({"max_tokens": True}, "sampling_parameters.max_tokens", "boolean"),
        ({"temperature": -0.1}, "sampling_parameters.temperature", "in [0, 2]"),
        ({"temperature": 2.1}, "sampling_parameters.temperature", "in [0, 2]"),
        ({"temperature": "hot"}, "sampling_parameters.temperature", "number"),
        ({"temperature": "nan"}, "sampling_parameters.temperature", "finite"),
        ({"top_p": 0}, "sampling_parameters.top_p", "(0, 1]"),
        ({"top_p": 1.01}, "sampling_parameters.top_p", "(0, 1]"),
        ({"top_k": -2}, "sampling_parameters.top_k", "-1 or 0"),
        ({"min_p": 2}, "sampling_parameters.min_p", "[0, 1]"),
        ({"presence_penalty": 3}, "sampling_parameters.presence_penalty", "[-2, 2]"),
        ({"repetition_penalty": 0}, "sampling_parameters.repetition_penalty", "(0, 2]"),
        ({"seed": -1}, "sampling_parameters.seed", "[0, 2^63)"),
        ({"stop": 5}, "sampling_parameters.stop", "list of strings"),
        ({"stop": [""]}, "sampling_parameters.stop", "must not be empty"),
        ({"stop_token_ids": [1, -3]}, "sampling_parameters.stop_token_ids[1]", ">= 0"),
        ({"logprobs": 50}, "sampling_parameters.logprobs", "[0, 20]"),
        ({"n": 0}, "sampling_parameters.n", "in [1, 128]"),
        ({"ignore_eos": "yes"}, "sampling_parameters.ignore_eos", "true or false"),
        ({"bogus": 1}, "sampling_parameters.bogus", "unknown sampling parameter"),
        ({"min_tokens": 9, "max_tokens": 4}, "sampling_parameters.min_tokens", "<= max_tokens"),
        (
            {"structured_outputs": {"json": 3}},
            "sampling_parameters.structured_outputs.json",
            "schema",
        ),
        ({"structured_outputs": {}}, "sampling_parameters.structured_outputs", "exactly one"),
        (
            {"structured_outputs": {"regex": "a", "disable_any_whitespace": True}},
            "sampling_parameters.structured_outputs.disable_any_whitespace",
            "applies to json and json_object, not regex",
        ),
        (
            {"structured_outputs": {"json_object": True, "disable_any_whitespace": "yes"}},
            "sampling_parameters.structured_outputs.disable_any_whitespace",
            "expected true or false",
        ),
        (
            {"structured_outputs": {"regex": "a", "choice": ["b"]}},
            "sampling_parameters.structured_outputs",
            "exactly one",
        ),
        (
            {"structured_outputs": {"shape": 1}},
            "sampling_parameters.structured_outputs.shape",
            "unknown",
        ),
        (
            {"structured_outputs": {"choice": []}},
            "sampling_parameters.structured_outputs.choice",
            "non-empty",
        ),
    ],
)
def test_bad_sampling_values_name_the_field_and_rule(values: dict, field: str, rule: str) -> None:
    err = error_of({"text_input": text("x"), "sampling_parameters": params(**values)})
    assert err.field == field
    assert rule in err.rule


def test_request_parameters_are_named_as_such() -> None:
    err = error_of({"text_input": text("x")}, {"top_p": 7})
    assert err.field == "parameters.top_p"


@pytest.mark.parametrize(
    ("raw", "rule"),
    [(b"{not json", "not valid JSON"), (b"[1, 2]", "JSON object"), (b"\xff\xfe", "UTF-8")],
)
def test_malformed_sampling_parameters(raw: bytes, rule: str) -> None:
    err = error_of({"text_input": text("x"), "sampling_parameters": text(raw)})
    assert err.field == "sampling_parameters"
    assert rule in err.rule


def test_structured_outputs_parsed_and_aliased() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    request = parse_request(
        {"text_input": text("x"), "sampling_parameters": params(guided_decoding={"json": schema})}
    )
    assert request.sampling.structured_outputs == StructuredOutput("json", schema)
    as_string = parse_request(
        {
            "text_input": text("x"),
            "sampling_parameters": params(structured_outputs={"json": json.dumps(schema)}),
        }
    )
    assert as_string.sampling.structured_outputs == StructuredOutput("json", schema)


@pytest.mark.parametrize(
    ("inputs", "field", "rule"),
    [
        ({}, "text_input", "exactly one"),
        ({"text_input": text("a"), "messages": text("[]")}, "text_input", "exactly one"),
        ({"text_input": text("   ")}, "text_input", "must not be empty"),
        ({"text_input": text(b"\xc3\x28")}, "text_input", "UTF-8"),
        (
            {"text_input": np.array([b"a", b"b"], dtype=np.object_)},
            "text_input",
            "exactly one element",
        ),
        ({"text_input": text("a"), "stream": np.array([1], dtype=np.int32)}, "stream", "BOOL"),
        ({"messages": text("not json")}, "messages", "not valid JSON"),
        ({"messages": text("[]")}, "messages", "non-empty"),
        ({"messages": text('[{"role": "wizard", "content": "x"}]')}, "messages[0].role", "one of"),
        ({"messages": text('[{"role": "user", "content": 3}]')}, "messages[0].content", "string"),
        (
            {"messages": text('[{"role": "user", "content": "x", "x": 1}]')},
            "messages[0].x",
            "unknown",
        ),
        ({"input_ids": np.array([], dtype=np.int32)}, "input_ids", "at least one"),
        ({"input_ids": np.array([1, -5], dtype=np.int32)}, "input_ids", ">= 0"),
        ({"input_ids": np.array([1.0], dtype=np.float32)}, "input_ids", "INT32 or INT64"),
    ],
)
def test_bad_inputs_name_the_input(inputs: dict, field: str, rule: str) -> None:
    err = error_of(inputs)
    assert err.field == field
    assert rule in err.rule
    assert str(err) == f"{field}: {err.rule}"


def test_chat_messages_and_token_ids() -> None:
    chat = parse_request({"messages": text('[{"role": "user", "content": "Hi"}]')})
    assert chat.messages == ({"role": "user", "content": "Hi"},)
    assert chat.prepend_input is False  # only a text prompt is echoed
    ids = parse_request({"input_ids": np.array([[5, 6, 7]], dtype=np.int64)})
    assert ids.prompt_ids == (5, 6, 7)


def test_return_flags_and_logprobs_default() -> None:
    request = parse_request(
        {
            "text_input": text("x"),
            "return_finish_reason": flag(True),
            "return_logprobs": flag(True),
            "return_output_ids": flag(True),
        }
    )
    assert request.returns.finish_reason and request.returns.output_ids
    assert not request.returns.num_input_tokens
    assert request.sampling.logprobs is None  # no count: the output is null, as upstream


@pytest.mark.parametrize(
    ("key", "named"), [("\x00", "\\x00"), ("a\nb", "a\\nb"), ("top\tp", "top\\tp"), ("é", "é")]
)
def test_an_unprintable_key_is_named_escaped_so_triton_carries_the_whole_message(
    key: str, named: str
) -> None:
    """Triton passes error messages as C strings: a raw NUL would end the message at it."""
    inputs = {
        "text_input": np.array([b"hi"], dtype=np.object_),
        "sampling_parameters": np.array([json.dumps({key: False}).encode()], dtype=np.object_),
    }
    with pytest.raises(RequestError) as caught:
        parse_request(inputs)
    message = str(caught.value)
    assert message.startswith(f"sampling_parameters.{named}: unknown sampling parameter")
    assert message.isprintable() and caught.value.field == f"sampling_parameters.{key}"
