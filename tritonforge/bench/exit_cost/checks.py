"""The golden requests and what each expects, none of it a model's words.

Every check sends fixed requests (greedy where the answer is compared with another of
the same server's answers) and judges the reply's shape, counts and finish reasons; the
behaviour it records is what an application would have coded against. Budgets are small
(``max_tokens`` ≤ 64): the suite takes seconds on a CPU.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jsonschema

from tritonforge.bench.exit_cost.results import CheckResult
from tritonforge.bench.exit_cost.transport import Reply, Transport

CHAT = "/chat/completions"

#: A multi-turn conversation with a system prompt: its prompt-token count is the chat
#: template's fingerprint.
TEMPLATE_MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another one, please."},
]
#: A prompt a small model keeps answering for long: a default bound shows before it stops.
LONG_ASK = [{"role": "user", "content": "Count from 1 to 500, one number per line."}]
SHORT_ASK = [{"role": "user", "content": "Write one sentence about the sea."}]

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "enum": ["yes", "no"]},
        "confidence": {"type": "integer", "enum": [1, 2, 3]},
    },
    "required": ["answer", "confidence"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "The weather now", "parameters": WEATHER},
}

#: Dashboard signals and the metric-family patterns that show them on the runtimes this
#: project knows (vLLM ``vllm:``, llama.cpp ``llamacpp:``, SGLang ``sglang:``, Triton
#: ``nv_``, this project ``tritonforge_``). A signal no family matches is a missing panel.
SIGNALS: dict[str, str] = {
    "requests running": r"num_requests_running|requests_processing|num_running_reqs",
    "requests waiting": r"num_requests_waiting|requests_deferred|num_queue_reqs"
    r"|pending_request_count",
    "KV cache use": r"kv_cache_usage|cache_usage_perc|token_usage|kv_cache_tokens",
    "time to first token": r"time_to_first_token",
    "time per output token": r"time_per_output_token|inter_token_latency|tokens_seconds",
    "request latency": r"e2e_request_latency|request_latency|request_duration",
    "prompt tokens": r"prompt_tokens",
    "generated tokens": r"generation_tokens|tokens_predicted|completion_tokens",
}
SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s")
MODEL_LABEL = re.compile(r'\bmodel(?:_name)?="([^"]*)"')
#: What a histogram's or summary's samples add to their family's name.
SAMPLE_SUFFIXES = ("_bucket", "_sum", "_count", "_created")


@dataclass
class Suite:
    """What the checks are run with."""

    model: str
    metrics_url: str | None = None
    adapter: str | None = None
    probe_tokens: int = 48  # how far a request without max_tokens is followed
    samples: int = 3  # requests without temperature, set against a greedy one


def _refused(check: str, reply: Reply, what: str) -> CheckResult:
    """A non-2xx reply: a 4xx is the feature refused, anything else a failure."""
    status = "unsupported" if 400 <= reply.status < 500 else "failed"
    return CheckResult(
        check=check,
        status=status,
        summary=f"{what}: HTTP {reply.status}",
        behaviour={"supported": False},
        evidence={"http_status": reply.status, "error": reply.error()},
    )


def _choice(reply: Reply) -> dict[str, Any]:
    choices = reply.body.get("choices") if isinstance(reply.body, dict) else None
    return choices[0] if choices else {}


def _content(reply: Reply) -> str:
    return (_choice(reply).get("message") or {}).get("content") or ""


def chat_template(t: Transport, suite: Suite) -> CheckResult:
    """The same messages give ``usage.prompt_tokens``: equal counts, equal templates."""
    name = "chat_template"
    body = {"model": suite.model, "messages": TEMPLATE_MESSAGES, "max_tokens": 1}
    reply = t.post(CHAT, body | {"temperature": 0})
    if not reply.ok:
        return _refused(name, reply, "chat request")
    usage = reply.body.get("usage") or {}
    tokens = usage.get("prompt_tokens")
    if not isinstance(tokens, int) or tokens <= 0:
        return CheckResult(
            check=name,
            status="failed",
            summary="no usage.prompt_tokens in the answer",
            evidence={"usage": usage},
        )
    return CheckResult(
        check=name,
        status="passed",
        summary=f"{tokens} prompt tokens for the 4-message conversation",
        behaviour={"prompt_tokens": tokens},
        evidence={"usage": usage},
    )


def _finish(events: list[dict[str, Any]]) -> str | None:
    reasons = [c.get("finish_reason") for e in events for c in e.get("choices") or []]
    return next((r for r in reversed(reasons) if r), None)


def default_max_tokens(t: Transport, suite: Suite) -> CheckResult:
    """A request without ``max_tokens``: bounded by a default, or generating on (the
    application must then bound it itself). Followed for ``probe_tokens`` chunks."""
    name = "default_max_tokens"
    body = {"model": suite.model, "messages": LONG_ASK, "temperature": 0, "stream": True}
    reply = t.post(CHAT, body, max_events=suite.probe_tokens + 1)
    if not reply.ok:
        return _refused(name, reply, "request without max_tokens")
    chunks = sum(
        1
        for e in reply.events
        if any((c.get("delta") or {}).get("content") for c in e.get("choices") or [])
    )
    finish = _finish(reply.events)
    evidence = {"content_chunks": chunks, "finish_reason": finish, "cut_by_client": reply.cut}
    # Chunks, not tokens: a server may send several tokens a chunk; the bound's kind is
    # what an application relies on, the count is evidence.
    if finish == "length":
        bound = f"bounded (finish_reason length after {chunks} chunks)"
    elif finish is None and reply.cut:
        bound = f"no bound within {suite.probe_tokens} chunks"
    elif finish == "stop":
        bound = "not seen (the model stopped first)"
    else:
        return CheckResult(
            check=name,
            status="failed",
            summary=f"stream ended without a finish reason after {chunks} chunks",
            evidence=evidence,
        )
    return CheckResult(
        check=name,
        status="passed",
        summary=f"without max_tokens: {bound}",
        behaviour={"default_bound": bound},
        evidence=evidence,
    )


def default_temperature(t: Transport, suite: Suite) -> CheckResult:
    """Requests without ``temperature``, set against the same request at temperature 0:
    does the server sample by default, or answer greedily? Compares the server's answers
    with each other, never with a text written here."""
    name = "default_temperature"
    body = {"model": suite.model, "messages": SHORT_ASK, "max_tokens": 8}
    greedy = t.post(CHAT, body | {"temperature": 0})
    if not greedy.ok:
        return _refused(name, greedy, "greedy request")
    answers = []
    for _ in range(suite.samples):
        reply = t.post(CHAT, body)
        if not reply.ok:
            return _refused(name, reply, "request without temperature")
        answers.append(_content(reply))
    same = sum(a == _content(greedy) for a in answers)
    default = "greedy" if same == len(answers) else "sampled"
    return CheckResult(
        check=name,
        status="passed",
        summary=f"without temperature: {same} of {len(answers)} answers equal the greedy one "
        f"({default})",
        behaviour={"default": default},
        evidence={"equal_to_greedy": same, "samples": len(answers), "distinct": len(set(answers))},
    )


def stop_sequence(t: Transport, suite: Suite) -> CheckResult:
    """A stop string taken from the server's own greedy answer cuts the answer just
    before it, with ``finish_reason: stop`` and the string left out."""
    name = "stop_sequence"
    body = {"model": suite.model, "messages": SHORT_ASK, "max_tokens": 16, "temperature": 0}
    free = t.post(CHAT, body)
    if not free.ok:
        return _refused(name, free, "greedy request")
    text = _content(free)
    start = len(text) // 2
    stop = text[start : start + 4]
    if len(text) < 8 or not stop.strip():
        return CheckResult(
            check=name,
            status="not run",
            summary="the greedy answer is too short to take a stop string from",
            evidence={"answer_chars": len(text)},
        )
    expected = text[: text.find(stop)]
    cut = t.post(CHAT, body | {"stop": [stop]})
    if not cut.ok:
        return _refused(name, cut, "request with stop")
    got, finish = _content(cut), _choice(cut).get("finish_reason")
    evidence = {
        "stop_chars": len(stop),
        "expected_chars": len(expected),
        "got_chars": len(got),
        "finish_reason": finish,
    }
    if got == expected and finish == "stop":
        return CheckResult(
            check=name,
            status="passed",
            summary="cut before the stop string, finish_reason stop, string not included",
            behaviour={"stop_included": False, "finish_reason": "stop"},
            evidence=evidence,
        )
    included = got == expected + stop
    return CheckResult(
        check=name,
        status="failed",
        summary="stop string included in the answer"
        if included
        else f"not cut where the stop string first appears ({len(got)} chars, "
        f"expected {len(expected)}; finish_reason {finish})",
        behaviour={"stop_included": included, "finish_reason": finish},
        evidence=evidence,
    )


def json_schema(t: Transport, suite: Suite) -> CheckResult:
    """``response_format: json_schema`` gives JSON valid under the schema."""
    name = "json_schema"
    body = {
        "model": suite.model,
        "messages": [{"role": "user", "content": "Is the sea salty? Answer in JSON."}],
        "max_tokens": 64,
        "temperature": 0,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA, "strict": True},
        },
    }
    reply = t.post(CHAT, body)
    if not reply.ok:
        return _refused(name, reply, "json_schema response_format")
    text, finish = _content(reply), _choice(reply).get("finish_reason")
    evidence = {"finish_reason": finish, "chars": len(text)}
    try:
        jsonschema.validate(json.loads(text), ANSWER_SCHEMA)
    except (ValueError, jsonschema.ValidationError) as error:
        kind = "not JSON" if isinstance(error, ValueError) else "JSON outside the schema"
        return CheckResult(
            check=name,
            status="failed",
            summary=f"{kind} (finish_reason {finish})",
            behaviour={"valid": False},
            evidence=evidence,
        )
    return CheckResult(
        check=name,
        status="passed",
        summary="valid under the schema",
        behaviour={"valid": True},
        evidence=evidence,
    )


def _call_faults(calls: Any) -> list[str]:
    """What is wrong with ``tool_calls`` against OpenAI's shape and the tool's schema."""
    if not isinstance(calls, list) or not calls:
        return ["no tool_calls in the message"]
    faults = []
    for call in calls:
        function = call.get("function") or {}
        if not isinstance(call.get("id"), str) or not call["id"]:
            faults.append("a call without an id")
        if call.get("type") != "function":
            faults.append(f"type {call.get('type')!r}, not 'function'")
        if function.get("name") != "get_weather":
            faults.append(f"function name {function.get('name')!r}")
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            faults.append("arguments are not a JSON string")
            continue
        try:
            jsonschema.validate(json.loads(arguments), WEATHER)
        except (ValueError, jsonschema.ValidationError):
            faults.append("arguments invalid under the tool's schema")
    return faults


def tool_call(t: Transport, suite: Suite) -> CheckResult:
    """A named ``tool_choice``: one call in OpenAI's shape, arguments valid."""
    name = "tool_call"
    body = {
        "model": suite.model,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "max_tokens": 64,
        "temperature": 0,
        "tools": [TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }
    reply = t.post(CHAT, body)
    if not reply.ok:
        return _refused(name, reply, "named tool_choice")
    choice = _choice(reply)
    message = choice.get("message") or {}
    faults = _call_faults(message.get("tool_calls"))
    finish = choice.get("finish_reason")
    behaviour = {
        "finish_reason": finish,
        "content": "null" if message.get("content") is None else "text",
    }
    evidence = {"finish_reason": finish, "calls": len(message.get("tool_calls") or [])}
    if faults:
        return CheckResult(
            check=name,
            status="failed",
            summary="; ".join(faults),
            behaviour=behaviour | {"shape": "broken"},
            evidence=evidence,
        )
    return CheckResult(
        check=name,
        status="passed",
        summary=f"one call in OpenAI's shape, arguments valid, finish_reason {finish}",
        behaviour=behaviour,
        evidence=evidence,
    )


def stream_usage(t: Transport, suite: Suite) -> CheckResult:
    """``stream_options.include_usage``: a last chunk with ``choices: []`` and the usage."""
    name = "stream_usage"
    body = {
        "model": suite.model,
        "messages": SHORT_ASK,
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    reply = t.post(CHAT, body)
    if not reply.ok:
        return _refused(name, reply, "stream_options.include_usage")
    with_usage = [e for e in reply.events if e.get("usage")]
    last = reply.events[-1] if reply.events else {}
    usage = last.get("usage") or {}
    evidence: dict[str, Any] = {
        "chunks": len(reply.events),
        "done": reply.done,
        "chunks_with_usage": len(with_usage),
        "usage": usage,
    }
    counts = [usage.get(k) for k in ("prompt_tokens", "completion_tokens", "total_tokens")]
    generated = counts[1] if isinstance(counts[1], int) else 0
    faults = []
    if not usage:
        faults.append("no usage in the last chunk")
    elif last.get("choices") != []:
        faults.append("the usage chunk carries choices")
    elif not all(isinstance(c, int) for c in counts) or not 0 < generated <= 8:
        faults.append(f"usage counts {counts}")
    if len(with_usage) > 1:
        faults.append(f"usage in {len(with_usage)} chunks, not only the last")
    if not reply.done:
        faults.append("no [DONE]")
    if faults:
        return CheckResult(
            check=name,
            status="failed",
            summary="; ".join(faults),
            behaviour={"usage_chunk": "missing or malformed"},
            evidence=evidence,
        )
    return CheckResult(
        check=name,
        status="passed",
        summary="a last chunk with choices [] and the usage, then [DONE]",
        behaviour={"usage_chunk": "last, choices []"},
        evidence=evidence,
    )


def adapter(t: Transport, suite: Suite) -> CheckResult:
    """A LoRA adapter named as the request's ``model``, as vLLM's server serves them."""
    name = "adapter"
    if not suite.adapter:
        return CheckResult(check=name, status="not run", summary="no --adapter given")
    body = {"model": suite.adapter, "messages": SHORT_ASK, "max_tokens": 4, "temperature": 0}
    reply = t.post(CHAT, body)
    if not reply.ok:
        return _refused(name, reply, f"model {suite.adapter!r}")
    usage = reply.body.get("usage") or {}
    return CheckResult(
        check=name,
        status="passed",
        summary=f"adapter {suite.adapter!r} answered by name",
        behaviour={"by_model_name": True},
        evidence={"model": reply.body.get("model"), "usage": usage},
    )


def metric_families(text: str, model: str | None = None) -> list[str]:
    """The metric families a Prometheus text exposition names, as its ``# TYPE`` lines
    declare them (a sample's ``_bucket``/``_sum``/``_count`` are its family's). With
    ``model``, a family whose samples all carry another model's label is left out: one
    server's dashboard shows the model it serves."""
    declared = {
        line.split()[2]
        for line in text.splitlines()
        if line.startswith("# TYPE ") and len(line.split()) > 2
    }
    kept: set[str] = set()
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if not match or line.startswith("#"):
            continue
        name, labels = match.groups()
        family = name
        if name not in declared:
            base = next((name[: -len(x)] for x in SAMPLE_SUFFIXES if name.endswith(x)), name)
            family = base if base in declared or not declared else name
        found = MODEL_LABEL.search(labels or "")
        if model is None or found is None or found.group(1) == model:
            kept.add(family)
    return sorted(kept)


def dashboard_families(names: list[str]) -> list[str]:
    """The families a dashboard could query: ``_created`` series (prometheus_client's
    creation timestamps, declared as gauges of their own) are left out."""
    return [n for n in names if not n.endswith("_created")]


def metrics(t: Transport, suite: Suite) -> CheckResult:
    """The families a dashboard's panels would query, per signal in :data:`SIGNALS`."""
    name = "metrics"
    if not suite.metrics_url:
        return CheckResult(check=name, status="not run", summary="no metrics URL")
    reply = t.get(suite.metrics_url)
    if not reply.ok:
        return _refused(name, reply, f"GET {suite.metrics_url}")
    families = dashboard_families(metric_families(reply.text, suite.model))
    found = {
        signal: [f for f in families if re.search(pattern, f)]
        for signal, pattern in SIGNALS.items()
    }
    missing = [s for s, names in found.items() if not names]
    evidence = {"families": len(families)}
    behaviour = {"signals": found}
    if missing:
        return CheckResult(
            check=name,
            status="failed",
            summary="no family for " + ", ".join(missing),
            behaviour=behaviour,
            evidence=evidence,
        )
    return CheckResult(
        check=name,
        status="passed",
        summary=f"every dashboard signal has a family ({len(families)} families)",
        behaviour=behaviour,
        evidence=evidence,
    )


CHECKS: dict[str, Callable[[Transport, Suite], CheckResult]] = {
    "chat_template": chat_template,
    "default_max_tokens": default_max_tokens,
    "default_temperature": default_temperature,
    "stop_sequence": stop_sequence,
    "json_schema": json_schema,
    "tool_call": tool_call,
    "stream_usage": stream_usage,
    "adapter": adapter,
    "metrics": metrics,
}


def run_all(t: Transport, suite: Suite, only: list[str] | None = None) -> list[CheckResult]:
    """Every check in order; a check that raises is recorded failed with the error."""
    results = []
    for name, check in CHECKS.items():
        if only and name not in only:
            continue
        try:
            results.append(check(t, suite))
        except Exception as error:  # a dropped connection, a body of the wrong type
            results.append(
                CheckResult(
                    check=name,
                    status="failed",
                    summary=f"{type(error).__name__}: {str(error)[:200]}",
                )
            )
    return results
