"""Chat requests: the ``messages`` input checked, and rendered into one prompt.

The ``messages`` input is a JSON list of OpenAI-style messages, or an object
``{"messages": [...], "tools": [...]}`` that also declares the functions the model may
call. Tool turns keep their structure here (an assistant's ``tool_calls``, a ``tool``
message's ``tool_call_id``) so that a model whose configuration names a tool-aware
``chat_template`` renders them its own way. A model left on its tokenizer's template
gets them as plain turns instead (:func:`plain_turns`): most small models' templates,
SmolLM2's among them, ignore ``tools`` and reject an assistant turn without content.

Both renderings write the Hermes/Qwen convention the OpenAI frontend parses back:
the tools' JSON schemas in the system turn, a call as
``<tool_call>{"name": …, "arguments": …}</tool_call>``, a result as
``<tool_response>…</tool_response>``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tritonforge.serving.errors import RequestError

CHAT_ROLES = ("system", "user", "assistant", "tool")
_MESSAGE_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id"}

Messages = tuple[dict[str, Any], ...]
Tools = tuple[dict[str, Any], ...]

TOOLS_SYSTEM_TEXT = (
    "You may call functions to answer. The functions, as JSON schemas:\n{tools}\n"
    'To call one, answer with <tool_call>{{"name": <function name>, '
    '"arguments": <arguments object>}}</tool_call> and nothing else.'
)


def parse_chat(raw: str) -> tuple[Messages, Tools]:
    """``(messages, tools)`` of a ``messages`` input; a :class:`RequestError` naming the
    message and key that breaks a rule."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise RequestError("messages", f"is not valid JSON ({exc.msg})") from None
    tools: Tools = ()
    if isinstance(value, dict) and "messages" in value:
        tools = _tools(value.get("tools"))
        value = value["messages"]  # an OpenAI request body's shape
    if not isinstance(value, list) or not value:
        raise RequestError("messages", "must be a non-empty JSON list of {role, content} objects")
    return tuple(check_message(f"messages[{i}]", m) for i, m in enumerate(value)), tools


def check_message(where: str, message: Any) -> dict[str, Any]:
    """One message checked (``where`` names it in errors); tool-call arguments parsed."""
    if not isinstance(message, dict):
        raise RequestError(where, "must be an object with role and content")
    extra = sorted(set(message) - _MESSAGE_KEYS)
    if extra:
        raise RequestError(f"{where}.{extra[0]}", f"unknown key; use {', '.join(_MESSAGE_KEYS)}")
    role, content = message.get("role"), message.get("content")
    if role not in CHAT_ROLES:
        raise RequestError(f"{where}.role", f"must be one of {CHAT_ROLES}, got {role!r}")
    result: dict[str, Any] = {"role": role, "content": content}
    if message.get("tool_calls") is not None:
        if role != "assistant":
            raise RequestError(f"{where}.tool_calls", "only an assistant message makes calls")
        calls = message["tool_calls"]
        if not isinstance(calls, list) or not calls:
            raise RequestError(f"{where}.tool_calls", "must be a non-empty list")
        result["tool_calls"] = [_call(f"{where}.tool_calls[{i}]", c) for i, c in enumerate(calls)]
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise RequestError(f"{where}.tool_call_id", "a tool message names its call's id")
        result["tool_call_id"] = call_id
    if not isinstance(content, str) and not (content is None and "tool_calls" in result):
        raise RequestError(f"{where}.content", "must be a string (null only beside tool_calls)")
    if isinstance(message.get("name"), str):
        result["name"] = message["name"]
    return result


def _call(where: str, call: Any) -> dict[str, Any]:
    """One ``tool_calls`` entry, arguments as an object (what templates write as JSON)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise RequestError(f"{where}.function.name", "required, a string")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise RequestError(f"{where}.function.arguments", "must be a JSON object") from None
    if not isinstance(arguments, dict):
        raise RequestError(f"{where}.function.arguments", "must be a JSON object")
    written = {"type": "function", "function": {"name": function["name"], "arguments": arguments}}
    return {"id": call["id"], **written} if isinstance(call.get("id"), str) else written


def _tools(value: Any) -> Tools:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise RequestError("tools", "must be a list of {type: function, function: {...}}")
    for i, tool in enumerate(value):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RequestError(f"tools[{i}].function.name", "required, a string")
    return tuple(value)


def tools_text(tools: Tools) -> str:
    """The system turn's note listing the tools."""
    return TOOLS_SYSTEM_TEXT.format(tools=json.dumps(list(tools), ensure_ascii=False))


def call_text(call: Mapping[str, Any]) -> str:
    function = call["function"]
    body = {"name": function["name"], "arguments": function["arguments"]}
    return f"<tool_call>{json.dumps(body, ensure_ascii=False)}</tool_call>"


def plain_turns(messages: Messages, tools: Tools) -> tuple[dict[str, str], ...]:
    """Tool turns as plain ``{role, content}`` turns any chat template can render."""
    turns = []
    for message in messages:
        content = message["content"] or ""
        if message["role"] == "tool":
            turns.append({"role": "user", "content": f"<tool_response>{content}</tool_response>"})
            continue
        calls = [call_text(c) for c in message.get("tool_calls", ())]
        turn = {"role": message["role"], "content": "\n".join(p for p in [content, *calls] if p)}
        if "name" in message:
            turn["name"] = message["name"]
        turns.append(turn)
    if tools:
        if turns[0]["role"] == "system":
            turns[0]["content"] = f"{turns[0]['content']}\n\n{tools_text(tools)}"
        else:
            turns.insert(0, {"role": "system", "content": tools_text(tools)})
    return tuple(turns)


class ChatTemplate:
    """A model's own Jinja chat template (``chat_template`` in its engine configuration).

    Rendered in a sandbox with the names Hugging Face templates use (``messages``,
    ``tools``, ``add_generation_prompt``, ``bos_token``, ``eos_token``,
    ``raise_exception``), so a template written for ``apply_chat_template`` works here
    for every engine alike.
    """

    def __init__(self, source: str, origin: str) -> None:
        environment = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        environment.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
        environment.globals["raise_exception"] = _raise
        try:
            self._template = environment.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"{origin}: line {exc.lineno}: {exc.message}") from None
        self.origin = origin

    @classmethod
    def load(cls, path: Path) -> ChatTemplate:
        if not path.is_file():
            raise FileNotFoundError(f"chat_template {path} is missing")
        return cls(path.read_text(encoding="utf-8"), path.name)

    def render(self, messages: Messages, tools: Tools, specials: Mapping[str, str]) -> str:
        try:
            return self._template.render(
                messages=list(messages),
                tools=list(tools) or None,
                add_generation_prompt=True,
                **specials,
            )
        except _TemplateRefused as exc:
            raise RequestError("messages", f"rejected by the chat template: {exc}") from None
        except jinja2.TemplateError as exc:
            raise RequestError("messages", f"{self.origin} could not render it: {exc}") from None


class _TemplateRefused(Exception):
    """A template's own ``raise_exception(...)``: the request's fault, said by the template."""


def _raise(message: str) -> None:
    raise _TemplateRefused(message)
