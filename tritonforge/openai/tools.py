"""Tool calling for ``/v1/chat/completions``: checking ``tools``/``tool_choice`` and the
tool turns of a conversation, and reading calls back out of the model's text.

Tool turns and the declared tools go to the model as they are (``{"messages": …,
"tools": …}``); the model renders them (:mod:`tritonforge.serving.chat`), with its own
tool-aware ``chat_template`` where it has one. Both renderings use the Hermes/Qwen
convention this module parses: ``<tool_call>{"name": …, "arguments": …}</tool_call>``.
``required`` and a named choice are not left to the model: structured output
constrains the answer to a call object whose ``name`` is one of the allowed tools and
whose ``arguments`` follow that tool's schema. ``auto`` reads the tagged calls out of
free text.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator, SchemaError

from tritonforge.openai.errors import invalid

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: arguments as a JSON string, as OpenAI sends them."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolPlan:
    """What a request's ``tools`` and ``tool_choice`` ask of the answer."""

    #: The declared functions, by name: {name, description, parameters}.
    functions: dict[str, dict[str, Any]]
    #: ``none`` (answer in text), ``auto`` (the model decides), ``forced``.
    mode: str
    #: The functions a forced answer may call.
    allowed: tuple[str, ...] = ()
    #: The client named the one function to call (``tool_choice: {"type": "function", …}``).
    named: bool = False

    @property
    def active(self) -> bool:
        return self.mode != "none"

    @property
    def calls_finish_reason(self) -> str:
        """The ``finish_reason`` of an answer that calls tools.

        OpenAI and vLLM answer ``"stop"`` when the client named the function (the call
        was an instruction carried out, not the model's choice), ``"tool_calls"`` else.
        """
        return "stop" if self.named else "tool_calls"

    def declared(self) -> list[dict[str, Any]]:
        """The tools as the model receives them (OpenAI's ``tools`` entries)."""
        return [{"type": "function", "function": f} for f in self.functions.values()]

    def structured(self) -> dict[str, Any]:
        """The JSON schema a forced answer is generated against: one call object."""
        options = [_call_schema(name, self.functions[name]) for name in self.allowed]
        return options[0] if len(options) == 1 else {"anyOf": options}


def _call_schema(name: str, function: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": function["parameters"]},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _function(index: int, tool: Any) -> dict[str, Any]:
    """``tools[index]`` checked: a function with a name and a JSON Schema object."""
    where = f"tools[{index}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise invalid(f'{where}.type: must be "function"', "tools")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise invalid(f"{where}.function: required, an object with a name", "tools")
    name = function.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        raise invalid(f"{where}.function.name: must be 1-64 of a-z, A-Z, 0-9, _ and -", "tools")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise invalid(
            f"{where}.function.parameters: must be a JSON Schema object "
            '(a JSON object with "type": "object")',
            "tools",
        )
    try:
        Draft202012Validator.check_schema(parameters)
    except SchemaError as exc:
        raise invalid(
            f"{where}.function.parameters: not a valid JSON Schema ({exc.message})", "tools"
        ) from None
    result = {"name": name, "parameters": parameters}
    if isinstance(function.get("description"), str):
        result["description"] = function["description"]
    return result


def plan(tools: list[Any] | None, choice: Any) -> ToolPlan | None:
    """The request's tool plan (None without tools); a 400 naming the field if wrong."""
    if not tools:
        if choice not in (None, "none"):
            raise invalid("tool_choice: requires tools", "tool_choice")
        return None
    functions: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        function = _function(i, tool)
        if function["name"] in functions:
            raise invalid(f"tools[{i}].function.name: {function['name']!r} is repeated", "tools")
        functions[function["name"]] = function
    if choice is None or choice in ("auto", "none"):
        return ToolPlan(functions, choice or "auto")
    if choice == "required":
        return ToolPlan(functions, "forced", tuple(functions))
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or name is None:
        raise invalid(
            'tool_choice: must be "none", "auto", "required" or '
            '{"type": "function", "function": {"name": …}}',
            "tool_choice",
        )
    if name not in functions:
        raise invalid(f"tool_choice.function.name: no tool named {name!r}", "tool_choice")
    return ToolPlan(functions, "forced", (name,), named=True)


def _call(obj: Any, plan_: ToolPlan) -> ToolCall | None:
    if not isinstance(obj, dict) or obj.get("name") not in plan_.functions:
        return None
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    text = json.dumps(arguments, ensure_ascii=False)
    return ToolCall(f"call_{uuid.uuid4().hex[:24]}", obj["name"], text)


def parse(text: str, plan_: ToolPlan) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of an answer; no calls means the answer is all content.

    A forced answer is one call object (structured output made it so); a free answer
    holds tagged calls, text before the first one being content.
    """
    if plan_.mode == "forced":
        try:
            call = _call(json.loads(text), plan_)
        except json.JSONDecodeError:
            call = None  # cut short by max_tokens: no call to report
        return (None, [call]) if call else (text, [])
    calls = []
    for raw in _CALL.findall(text):
        try:
            call = _call(json.loads(raw), plan_)
        except json.JSONDecodeError:
            call = None
        if call is not None:
            calls.append(call)
    if not calls:
        return text, []
    before = text[: text.find("<tool_call>")].strip()
    return before or None, calls
