"""Chat messages with tool turns: the schema's rules, and the shipped tool-aware template.

The template shipped beside vllm_model and llamacpp_model must render every chat the way
SmolLM2's own template renders the same chat written as plain turns — so a chat without
tools reads to the model exactly as before, and a tool chat reads the way the OpenAI
frontend parses calls back. The reference is SmolLM2's own template, through the
tokenizer the server loads.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from transformers import AutoTokenizer

from tests.tokenizers_under_test import SMOLLM2
from tritonforge.paths import REPO_ROOT
from tritonforge.serving.chat import ChatTemplate, parse_chat, plain_turns
from tritonforge.serving.errors import RequestError

SHIPPED = [
    REPO_ROOT / "model_repository" / name / "1" / "chat_template.jinja"
    for name in ("vllm_model", "llamacpp_model")
]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather now",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
CHATS: dict[str, dict[str, Any]] = {
    "plain": {"messages": [{"role": "user", "content": "Hi"}]},
    "system": {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Bye"},
        ]
    },
    "tools": {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER]},
    "tools_and_system": {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Paris?"},
        ],
        "tools": [WEATHER],
    },
    "tool_loop": {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [CALL, CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        ],
        "tools": [WEATHER],
    },
    "call_with_text": {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        ],
        "tools": [WEATHER],
    },
}


@pytest.fixture(scope="module")
def native() -> Any:
    assert SMOLLM2.is_file(), f"{SMOLLM2} missing: run `python -m tritonforge.launch.model_store`"
    return AutoTokenizer.from_pretrained(str(SMOLLM2.parent))


@pytest.mark.parametrize("template", SHIPPED, ids=lambda p: p.parent.parent.name)
@pytest.mark.parametrize("name", sorted(CHATS))
def test_shipped_template_renders_as_smollm2_does_with_plain_turns(
    native: Any, template: Any, name: str
) -> None:
    messages, tools = parse_chat(json.dumps(CHATS[name]))
    expected = native.apply_chat_template(
        list(plain_turns(messages, tools)), tokenize=False, add_generation_prompt=True
    )
    assert ChatTemplate.load(template).render(messages, tools, {}) == expected


def test_tool_turns_keep_their_structure() -> None:
    messages, tools = parse_chat(json.dumps(CHATS["tool_loop"]))
    assert tools == (WEATHER,)
    call = messages[1]["tool_calls"][0]
    assert call["function"]["arguments"] == {"city": "Paris"}  # an object, as templates want it
    assert messages[1]["content"] is None
    assert messages[2]["tool_call_id"] == "call_1"
    rendered = ChatTemplate.load(SHIPPED[0]).render(messages, tools, {})
    assert (
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in rendered
    )
    assert "<tool_response>18 C</tool_response>" in rendered
    assert json.dumps([WEATHER]) in rendered


def test_a_plain_list_has_no_tools() -> None:
    messages, tools = parse_chat('[{"role": "user", "content": "Hi", "name": "ann"}]')
    assert messages == ({"role": "user", "content": "Hi", "name": "ann"},) and tools == ()


@pytest.mark.parametrize(
    ("chat", "field", "rule"),
    [
        ("{", "messages", "not valid JSON"),
        ("[]", "messages", "non-empty"),
        ('[{"role": "user"}]', "messages[0].content", "must be a string"),
        ('[{"role": "robot", "content": "x"}]', "messages[0].role", "must be one of"),
        ('[{"role": "user", "content": "x", "mood": 1}]', "messages[0].mood", "unknown key"),
        ('[{"role": "tool", "content": "x"}]', "messages[0].tool_call_id", "names its call"),
        (
            '[{"role": "user", "content": "x", "tool_calls": []}]',
            "messages[0].tool_calls",
            "only an assistant",
        ),
        (
            '[{"role": "assistant", "content": null, "tool_calls": [{"function": {}}]}]',
            "messages[0].tool_calls[0].function.name",
            "required",
        ),
        (
            '[{"role": "assistant", "content": null, "tool_calls": '
            '[{"function": {"name": "f", "arguments": "{oops"}}]}]',
            "messages[0].tool_calls[0].function.arguments",
            "JSON object",
        ),
        ('{"messages": [{"role": "user", "content": "x"}], "tools": {}}', "tools", "a list"),
        (
            '{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}',
            "tools[0].function.name",
            "required",
        ),
    ],
)
def test_bad_chats_name_the_field(chat: str, field: str, rule: str) -> None:
    with pytest.raises(RequestError) as caught:
        parse_chat(chat)
    assert caught.value.field == field
    assert rule in caught.value.rule


def test_a_template_that_refuses_names_its_reason() -> None:
    template = ChatTemplate("{{ raise_exception('no system turns') }}", "strict.jinja")
    with pytest.raises(RequestError, match="rejected by the chat template: no system turns"):
        template.render(({"role": "user", "content": "x"},), (), {})


def test_a_broken_template_fails_at_load_with_its_line() -> None:
    with pytest.raises(ValueError, match=r"broken.jinja: line 2"):
        ChatTemplate("ok\n{% if %}", "broken.jinja")
