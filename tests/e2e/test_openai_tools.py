"""Tool calling through the OpenAI frontend on the real stack, driven by the ``openai`` SDK.

Expectations never depend on the model's words: a forced call (named or ``required``)
must name an allowed tool and carry arguments valid under that tool's schema (structured
output guarantees it); the SDK's loop (call → tool message → answer) must complete; a
streamed call must arrive as OpenAI streams calls.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.e2e.client import model_ready
from tritonforge.bench.exit_cost.checks import WEATHER  # the exit-cost suite's tool, too
from tritonforge.launch.launcher import OpenAIFrontend, TritonServer

pytestmark = pytest.mark.server

MODEL = "vllm_model"
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER},
    },
    {
        "type": "function",
        "function": {"name": "get_time", "description": "The time now", "parameters": TIME},
    },
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def _longest_call(name: str) -> int:
    """Characters in the longest call of ``name`` its schema allows, with the widest
    separators a compact JSON grammar may use (every property is an ``enum``)."""
    properties = SCHEMAS[name]["properties"]
    arguments = {key: max(spec["enum"], key=len) for key, spec in properties.items()}
    call = {"name": name, "arguments": arguments}
    return len(json.dumps(call, separators=(", ", ": ")))


#: A forced call is generated compact and every token carries at least one character,
#: so this many tokens (the longest call, then the end of the answer) always close it:
#: a ``length`` finish would be the server's fault, never the model's choice.
CALL_BUDGET = max(_longest_call(name) for name in SCHEMAS) + 1


@pytest.fixture(scope="module")
def client(frontend: OpenAIFrontend, triton_server: TritonServer) -> openai.OpenAI:
    if not model_ready(triton_server, MODEL):
        pytest.skip(f"{MODEL} is not loaded on this machine")
    return openai.OpenAI(base_url=frontend.base_url, api_key="unused", max_retries=0, timeout=300)


def _valid_call(call, allowed: set[str]) -> dict:
    assert call.type == "function" and call.id
    assert call.function.name in allowed
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return arguments


@pytest.mark.speed
def test_a_named_choice_returns_a_call_valid_under_its_schema(client) -> None:
    answer = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=CALL_BUDGET,
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "stop" and choice.message.content is None  # as OpenAI
    assert len(choice.message.tool_calls) == 1
    _valid_call(choice.message.tool_calls[0], {"get_time"})


@pytest.mark.speed
def test_required_returns_a_call_of_one_of_the_tools(client) -> None:
    answer = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=CALL_BUDGET
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    _valid_call(choice.message.tool_calls[0], set(SCHEMAS))


def _tool_loop(client: openai.OpenAI, model: str) -> None:
    """Call → the tool's answer as a ``tool`` message → a final answer, SDK objects reused."""
    messages: list = list(ASK)
    first = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, tool_choice="required", max_tokens=CALL_BUDGET
    )
    message = first.choices[0].message
    messages.append(message)  # the SDK's own object: content None, tool_calls set
    for call in message.tool_calls:
        result = {"temperature": 21, "unit": "celsius"}
        messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    final = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, tool_choice="auto", max_tokens=48
    )
    choice = final.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    if choice.finish_reason == "tool_calls":
        # ``auto`` is free text read back: the shape is the server's, the values the
        # model's (they need not satisfy an enum it was never held to).
        for call in choice.message.tool_calls:
            assert call.function.name in SCHEMAS and call.id
            assert isinstance(json.loads(call.function.arguments), dict)
    else:
        assert isinstance(choice.message.content, str) and not choice.message.tool_calls


@pytest.mark.speed
def test_the_sdk_tool_loop_completes(client) -> None:
    _tool_loop(client, MODEL)


def test_the_sdk_tool_loop_completes_on_llamacpp(client, triton_server: TritonServer) -> None:
    """llama.cpp renders the same tool turns with the template shipped beside it."""
    if not model_ready(triton_server, "llamacpp_model"):
        pytest.skip("llamacpp_model is not loaded on this machine")
    _tool_loop(client, "llamacpp_model")


@pytest.mark.speed
def test_a_streamed_call_arrives_as_openai_streams_it(client) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=CALL_BUDGET,
            stream=True,
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    calls = [d.tool_calls[0] for d in deltas if d.tool_calls]
    assert calls[0].id and calls[0].type == "function"
    assert calls[0].function.name == "get_weather"
    assert all(c.index == 0 for c in calls) and all(c.id is None for c in calls[1:])
    arguments = "".join(c.function.arguments or "" for c in calls)
    jsonschema.validate(json.loads(arguments), WEATHER)
    assert chunks[-1].choices[0].finish_reason == "stop"  # a named function, as OpenAI


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"messages": [*ASK, {"role": "tool", "content": "21"}]}, "messages"),
    ],
)
def test_bad_tool_input_is_a_400_naming_the_field(client, change: dict, param: str) -> None:
    body = {"model": MODEL, "messages": ASK, "tools": TOOLS, **change}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(**body)
    assert caught.value.body["param"] == param


@pytest.mark.speed
def test_langchain_bind_tools_gets_a_call_valid_under_its_schema(frontend, client) -> None:
    """LangChain's ``ChatOpenAI.bind_tools`` reads the answer's calls into ``tool_calls``."""
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model=MODEL,
        base_url=frontend.base_url,
        api_key="unused",
        max_tokens=CALL_BUDGET,
        max_retries=0,
    )
    bound = llm.bind_tools(TOOLS, tool_choice="get_weather")
    message = bound.invoke("What is the weather in Rome?")
    [call] = message.tool_calls
    assert call["name"] == "get_weather" and call["id"]
    jsonschema.validate(call["args"], WEATHER)
