"""The README example checks of tests/e2e/readme_examples.py can fail: they are tested here
on recorded answer shapes, without a server (the examples themselves run in
tests/e2e/test_readme_examples.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tests.e2e import readme_examples as ex

ADDRESSES = ex.Addresses(http="127.0.0.1:18000", grpc="127.0.0.1:18001", openai="127.0.0.1:19000")
PROMPT = {"text_input": "What is the capital of France?"}


def test_readme_has_request_examples_and_addresses_are_rewritten() -> None:
    requests = [b for b in ex.blocks() if b.is_request()]
    assert any(b.lang == "python" for b in requests)
    assert any(ex.curl_commands(b.code) for b in requests)
    rewritten = ADDRESSES.rewrite(
        "curl localhost:8000/x; OpenAI(base_url='http://127.0.0.1:9000/v1'); c('127.0.0.1:8001')"
    )
    assert rewritten == (
        "curl 127.0.0.1:18000/x; OpenAI(base_url='http://127.0.0.1:19000/v1'); c('127.0.0.1:18001')"
    )


def test_curl_commands_are_split_and_keep_their_documented_answer() -> None:
    code = (
        "curl -s -X POST localhost:8000/v2/models/m/generate -d '{\n"
        '  "text_input": "hi"}\'\n'
        '# for instance: {"model_name":"m","text_output":"hi there"}\n'
        "curl -sN localhost:8000/v2/models/m/generate_stream -d '{}'\n"
    )
    first, second = ex.curl_commands(code)
    assert first.documented == '{"model_name":"m","text_output":"hi there"}'
    assert "text_input" in first.command and second.documented is None


@pytest.mark.parametrize(
    "answer",
    [
        {"model_name": "m", "text_output": PROMPT["text_input"]},  # the prompt, nothing generated
        {"model_name": "m", "text_output": PROMPT["text_input"] + "  \n"},
        {"model_name": "m", "text_output": "", "error": "boom"},
    ],
)
def test_a_triton_answer_that_generates_nothing_fails(answer: dict) -> None:
    with pytest.raises(AssertionError):
        ex._check_triton("/v2/models/m/generate", PROMPT, json.dumps(answer), None)


def test_a_triton_answer_with_text_passes_and_documented_fields_are_required() -> None:
    answer = json.dumps({"model_name": "m", "text_output": PROMPT["text_input"] + " Paris."})
    ex._check_triton(
        "/v2/models/m/generate", PROMPT, answer, '{"model_name": "", "text_output": ""}'
    )
    with pytest.raises(AssertionError):
        ex._check_triton("/v2/models/m/generate", PROMPT, answer, '{"model_version": "1"}')


def test_an_empty_stream_fails() -> None:
    empty = 'data: {"text_output": ""}\n\ndata: {"text_output": " "}\n\n'
    with pytest.raises(AssertionError):
        ex._check_triton("/v2/models/m/generate_stream", {"stream": True}, empty, None)


@pytest.mark.parametrize(
    ("content", "usage"),
    [("", {"prompt_tokens": 5, "completion_tokens": 1}), ("Paris.", {"prompt_tokens": 5})],
)
def test_an_openai_answer_without_content_or_counts_fails(content: str, usage: dict) -> None:
    answer = {"choices": [{"message": {"content": content}, "finish_reason": "stop"}]}
    with pytest.raises(AssertionError):
        ex._check_openai("/v1/chat/completions", {}, json.dumps(answer | {"usage": usage}))


def test_a_python_example_that_prints_an_error_or_nothing_fails() -> None:
    with pytest.raises(AssertionError):
        ex.run_python("print(ValueError('no model'))", ADDRESSES)
    with pytest.raises(AssertionError):
        ex.run_python("print('', end='')", ADDRESSES)
    with pytest.raises(AssertionError):  # the SDK's usage object with no generated token
        ex._check_usage(SimpleNamespace(prompt_tokens=3, completion_tokens=0))
    ex.run_python("print('Paris.')\nfor p in ['a', 'b']:\n    print(p, end='')", ADDRESSES)
