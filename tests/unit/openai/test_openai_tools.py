"""Tool calling without a server: checking tools, writing tool turns, reading calls back.

The routes run against the fake gateway of test_openai_translate, so the answer's
``tool_calls`` and the streamed call chunks are checked against the response models;
the real model is tests/e2e/test_openai_tools.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.unit.openai.test_openai_translate import (
    USER,
    FakeGateway,
    chat,
    client,
    conforms,
    error_of,
    sse_events,
)
from tritonforge.openai import tools
from tritonforge.openai.responses import ChatCompletion, ChatCompletionChunk
from tritonforge.openai.translate import ModelOutput

PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {"type": "function", "function": {"name": "weather", "parameters": PARAMS}},
    {"type": "function", "function": {"name": "time"}},
]
STRING = {"type": "string"}
BAD = {"type": "object", "properties": {"a": {"type": 5}}}
NAMED = {"type": "function", "function": {"name": "weather"}}


def sent(request: Any) -> Any:
    return json.loads(request.prompt)


def test_tools_go_to_the_model_beside_the_messages() -> None:
    request = chat(tools=TOOLS)
    body = sent(request)
    assert body["messages"] == USER
    assert [t["function"]["name"] for t in body["tools"]] == ["weather", "time"]
    assert body["tools"][0] == {
        "type": "function",
        "function": {"name": "weather", "parameters": PARAMS},
    }
    assert "structured_outputs" not in request.sampling  # auto: free text, parsed after


def test_none_leaves_tools_out_of_the_prompt() -> None:
    request = chat(tools=TOOLS, tool_choice="none")
    assert sent(request) == USER and request.tools is None


def test_a_named_choice_constrains_the_answer_to_that_call() -> None:
    schema = chat(tools=TOOLS, tool_choice=NAMED).sampling["structured_outputs"]["json"]
    assert schema["properties"] == {"name": {"const": "weather"}, "arguments": PARAMS}
    required = chat(tools=TOOLS, tool_choice="required").sampling["structured_outputs"]["json"]
    names = [option["properties"]["name"]["const"] for option in required["anyOf"]]
    assert names == ["weather", "time"]


def test_a_forced_call_is_generated_compact() -> None:
    """No free whitespace: a forced call's length is bounded by the names and schemas,
    so a budget that fits the longest call always sees it close."""
    for choice in (NAMED, "required"):
        structured = chat(tools=TOOLS, tool_choice=choice).sampling["structured_outputs"]
        assert structured["disable_any_whitespace"] is True


def test_assistant_calls_and_tool_results_keep_their_structure() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    history = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "21 C"},
    ]
    written = sent(chat(tools=TOOLS, messages=history))["messages"]
    parsed = {**call, "function": {"name": "weather", "arguments": {}}}
    assert written[1] == {"role": "assistant", "content": None, "tool_calls": [parsed]}
    assert written[2] == {"role": "tool", "content": "21 C", "tool_call_id": "c1"}


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": 1}}]}, "tools",
         "parameters: must be a JSON Schema object"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": STRING}}]},
         "tools", "JSON Schema object"),
        ({"tools": [{"type": "code"}]}, "tools", "tools[0].type"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": BAD}}]},
         "tools", "not a valid JSON Schema"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
         "tool_choice", "no tool named 'x'"),
        ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice", "tool_choice: must be"),
        ({"tool_choice": "required"}, "tool_choice", "requires tools"),
        ({"messages": [*USER, {"role": "tool", "content": "1"}]}, "messages",
         "messages[1].tool_call_id"),
        ({"messages": [*USER, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]},
         "messages", "messages[1].tool_calls[0].function.arguments: must be a JSON object"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
         "response_format", "cannot be combined"),
    ],
)  # fmt: skip
def test_bad_tool_input_is_a_400_naming_the_field(body: dict, param: str, says: str) -> None:
    error = error_of(lambda: chat(**body))
    assert (error.status, error.param) == (400, param) and says in error.message


def test_parsing_free_text_and_forced_answers() -> None:
    plan = tools.plan(TOOLS, "auto")
    assert plan is not None
    content, calls = tools.parse('Sure. <tool_call>{"name": "weather", "arguments": '
                                 '{"city": "Oslo"}}</tool_call>', plan)  # fmt: skip
    assert content == "Sure." and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("weather", {"city": "Oslo"})
    ]
    assert tools.parse("no call here", plan) == ("no call here", [])
    unknown = '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
    assert tools.parse(unknown, plan) == (unknown, [])  # not a declared tool: plain text
    forced = tools.plan(TOOLS, NAMED)
    assert forced is not None
    _, [call] = tools.parse('{"name": "weather", "arguments": {"city": "Rome"}}', forced)
    assert call.id.startswith("call_") and json.loads(call.arguments) == {"city": "Rome"}
    assert tools.parse('{"name": "weather", "argu', forced)[1] == []  # cut short


CALL_TEXT = '{"name": "weather", "arguments": {"city": "Rome"}}'


def _outputs() -> list[ModelOutput]:
    half = len(CALL_TEXT) // 2
    return [
        ModelOutput(CALL_TEXT[:half], "None", 5, 3),
        ModelOutput(CALL_TEXT[half:], "stop", 5, 4, final=True),
    ]


@pytest.mark.parametrize(("tool_choice", "reason"), [(NAMED, "stop"), ("required", "tool_calls")])
def test_an_answer_carries_tool_calls_and_openai_finish_reason(
    tool_choice: object, reason: str
) -> None:
    """A named function answers "stop" (OpenAI, vLLM); a call the model chose "tool_calls"."""
    body = {"model": "llm", "messages": USER, "tools": TOOLS, "tool_choice": tool_choice}
    reply = client(FakeGateway(_outputs())).post("/v1/chat/completions", json=body)
    answer = conforms(reply.text, ChatCompletion)
    choice = answer["choices"][0]
    assert choice["finish_reason"] == reason and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Rome"}


def test_a_streamed_call_is_id_and_name_then_arguments_then_the_finish() -> None:
    body = {
        "model": "llm",
        "messages": USER,
        "tools": TOOLS,
        "tool_choice": NAMED,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    reply = client(FakeGateway(_outputs())).post("/v1/chat/completions", json=body)
    events = sse_events(reply.text)
    assert events[-1] == "[DONE]"
    sent = [conforms(e, ChatCompletionChunk) for e in events[:-1]]
    deltas = [c["choices"][0]["delta"] for c in sent if c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    head, args = deltas[1]["tool_calls"][0], deltas[2]["tool_calls"][0]
    assert head["id"].startswith("call_") and head["function"] == {
        "name": "weather",
        "arguments": "",
    }
    assert args == {"index": 0, "function": {"arguments": json.dumps({"city": "Rome"})}}
    assert sent[-2]["choices"][0]["finish_reason"] == "stop"  # a named function
    assert sent[-1]["usage"]["completion_tokens"] == 7


def test_auto_without_a_call_streams_the_text() -> None:
    outputs = [ModelOutput("Hello", "None", 5, 1), ModelOutput("", "stop", 5, 1, final=True)]
    body = {"model": "llm", "messages": USER, "tools": TOOLS, "stream": True}
    events = sse_events(client(FakeGateway(outputs)).post("/v1/chat/completions", json=body).text)
    sent = [conforms(e, ChatCompletionChunk) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in sent) == "Hello"
    assert sent[-1]["choices"][0]["finish_reason"] == "stop"
