"""A storm of generated malformed requests: each refused, naming its field.

hypothesis builds each request from a valid one with exactly one thing broken — bad
JSON in ``sampling_parameters``, an unknown key, a value of the wrong type or out of its
range, an empty or over-long prompt, broken chat messages — so the field the error must
name is known from how the request was built, not from the server's own parser. Each
goes over HTTP ``/generate`` (answer: a 4xx whose ``error`` names the field) or a gRPC
stream (an error response naming it; a stream response carries only the message, no
status code). After every request the model must still report ready, and after the
storm the greedy answer to a fixed prompt must equal the one taken before it, on the
same server (never a hard-coded text: it differs between CPUs).

Left out on purpose, because Triton 2.51's HTTP frontend answers them 500 before any
model code runs (docs/triton-2.51-workarounds.md): a non-boolean ``stream`` or
``exclude_input_in_output``, a number or object as ``text_input``, a string as
``input_ids``, a body that is not JSON. Request parameters carry only scalars (the
frontends' own rule), and over gRPC every tensor has the type the model declares:
a request Triton's own validation refuses on a stream keeps the model from unloading
(docs/triton-2.51-workarounds.md).
"""

from __future__ import annotations

import contextlib
import json
import math
import queue
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import requests
import tritonclient.grpc as grpcclient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from tritonclient.utils import InferenceServerException

from tritonforge.bench.reliability.clients import Server
from tritonforge.bench.reliability.models import ENSEMBLE, LLM
from tritonforge.bench.reliability.verdict import Scenario, judged
from tritonforge.serving.errors import printable
from tritonforge.serving.sampling import ACCEPTED_KEYS, MAX_N
from tritonforge.serving.schema import TRANSPORT_PARAMETERS

INT_KEYS = ("max_tokens", "min_tokens", "top_k", "seed", "logprobs", "n")
FLOAT_KEYS = (
    "temperature",
    "top_p",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "timeout_s",
)
BOOL_KEYS = ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output")
INT64 = (-(2**63), 2**63 - 1)
CONTEXT = 2048  # vllm_model's max_model_len (model.json)
GREEDY_PROMPT = "The three primary colours are"
GREEDY = {"temperature": 0, "max_tokens": 12, "ignore_eos": True}


@dataclass(frozen=True)
class Malformed:
    """One request with one thing wrong; ``field`` is what its error must name."""

    what: str
    field: str
    transport: str  # "http" (/generate) or "grpc" (a stream)
    model: str = LLM
    text_input: str | None = "Hello"
    messages: str | None = None
    sampling_parameters: str | None = None
    parameters: dict[str, Any] | None = None

    def http_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {}
        for name in ("text_input", "messages", "sampling_parameters"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        if self.parameters is not None:
            body["parameters"] = self.parameters
        return body


# --- values that break a rule --------------------------------------------------------

_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
_IDENTIFIER = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz_"), min_size=1, max_size=16)
_JSONISH = st.one_of(
    st.booleans(),
    st.integers(*INT64),
    st.floats(allow_nan=False, allow_infinity=False),
    _TEXT,
    st.lists(st.integers(0, 9), max_size=3),
    st.dictionaries(st.sampled_from("abc"), st.integers(0, 9), max_size=2),
)


def _not_int(text: str) -> bool:
    try:
        int(text.strip())
    except ValueError:
        return True
    return False


def _not_finite_number(text: str) -> bool:
    try:
        return not math.isfinite(float(text.strip()))
    except ValueError:
        return True


_COLLECTIONS = st.one_of(
    st.lists(st.integers(0, 9), min_size=0, max_size=3),
    st.dictionaries(st.sampled_from("xyz"), st.integers(0, 9), min_size=0, max_size=2),
)


def _wrong_type(key: str) -> st.SearchStrategy[Any]:
    """Values of the wrong JSON type for ``key`` (numbers may come as numeric strings)."""
    if key in INT_KEYS:
        return st.one_of(
            st.booleans(),
            _COLLECTIONS,
            _TEXT.filter(_not_int),
            st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer()),
        )
    if key in FLOAT_KEYS:
        return st.one_of(st.booleans(), _COLLECTIONS, _TEXT.filter(_not_finite_number))
    if key in BOOL_KEYS:
        return st.one_of(
            st.integers(*INT64),
            st.floats(allow_nan=False),
            _COLLECTIONS,
            _TEXT.filter(lambda t: t.strip().lower() not in ("true", "false")),
        )
    if key == "stop":
        return st.one_of(
            st.integers(*INT64),
            st.booleans(),
            st.just(""),
            st.lists(st.just(""), min_size=1, max_size=2),
            st.lists(st.integers(0, 9), min_size=1, max_size=3),
            st.lists(st.just("x"), min_size=17, max_size=20),
        )
    if key == "stop_token_ids":
        return st.one_of(
            st.integers(*INT64),
            _TEXT,
            st.lists(st.integers(-(2**31), -1), min_size=1, max_size=2),
            st.lists(_TEXT.filter(_not_int), min_size=1, max_size=2),
        )
    raise KeyError(key)


def _outside(low: float, high: float) -> st.SearchStrategy[float]:
    """Finite floats below ``low`` or above ``high``."""
    return st.one_of(
        st.floats(max_value=low, exclude_max=True, allow_nan=False, allow_infinity=False),
        st.floats(min_value=high, exclude_min=True, allow_nan=False, allow_infinity=False),
    )


_RANGES: dict[str, st.SearchStrategy[Any]] = {
    "max_tokens": st.integers(INT64[0], 0),
    "min_tokens": st.integers(INT64[0], -1),
    "top_k": st.integers(INT64[0], -2),
    "seed": st.one_of(st.integers(INT64[0], -1), st.integers(2**63, 2**70)),
    "logprobs": st.one_of(st.integers(INT64[0], -1), st.integers(21, INT64[1])),
    "n": st.one_of(st.integers(INT64[0], 0), st.integers(MAX_N + 1, INT64[1])),
    "temperature": st.floats(max_value=-1e-6, allow_nan=False, allow_infinity=False),
    "top_p": st.one_of(
        st.floats(max_value=0.0, allow_nan=False, allow_infinity=False),
        st.floats(min_value=1.0001, allow_nan=False, allow_infinity=False),
    ),
    "min_p": st.one_of(
        st.floats(max_value=-1e-6, allow_nan=False, allow_infinity=False),
        st.floats(min_value=1.0001, allow_nan=False, allow_infinity=False),
    ),
    "presence_penalty": _outside(-2.0, 2.0),
    "frequency_penalty": _outside(-2.0, 2.0),
    "repetition_penalty": st.one_of(
        st.floats(max_value=0.0, allow_nan=False, allow_infinity=False),
        st.floats(min_value=2.0001, allow_nan=False, allow_infinity=False),
    ),
    "timeout_s": st.floats(max_value=0.0, allow_nan=False, allow_infinity=False),
}

_STRUCTURED_BAD = st.one_of(
    _JSONISH.filter(lambda v: not isinstance(v, dict | str)),
    st.just({}),
    st.just({"regex": "[0-9]+", "choice": ["a"]}),
    st.builds(lambda k: {k: 1}, st.text(st.sampled_from("qwxyz_"), min_size=1, max_size=6)),
    st.just({"regex": ""}),
    st.just({"choice": []}),
    st.lists(st.integers(0, 9), min_size=1, max_size=2).map(lambda c: {"choice": c}),
    st.just({"json": "{not json"}),
    st.just({"json_object": False}),
    st.just({"choice": ["a"], "disable_any_whitespace": True}),
    st.just({"json_object": True, "disable_any_whitespace": "yes"}),
)


def _scalar(value: Any) -> bool:
    """A value a request parameter can carry: string, bool, int64 or finite double."""
    if isinstance(value, bool | str):
        return True
    if isinstance(value, int):
        return INT64[0] <= value <= INT64[1]
    return isinstance(value, float) and math.isfinite(value)


@st.composite
def _sampling_fault(draw: st.DrawFn) -> tuple[str, str, Any]:
    """(what, key, value): one sampling key with a value that breaks its rule."""
    kind = draw(st.sampled_from(("wrong_type", "out_of_range", "unknown_key", "structured")))
    if kind == "wrong_type":
        key = draw(st.sampled_from((*INT_KEYS, *FLOAT_KEYS, *BOOL_KEYS, "stop", "stop_token_ids")))
        return kind, key, draw(_wrong_type(key))
    if kind == "out_of_range":
        key = draw(st.sampled_from(sorted(_RANGES)))
        return kind, key, draw(_RANGES[key])
    if kind == "structured":
        return kind, "structured_outputs", draw(_STRUCTURED_BAD)
    taken = {*ACCEPTED_KEYS, "guided_decoding", *TRANSPORT_PARAMETERS}
    key = draw(
        st.one_of(_IDENTIFIER, _TEXT.filter(bool)).filter(
            lambda k: k not in taken and not k.startswith("triton")
        )
    )
    return kind, key, draw(_JSONISH)


def _sampling_case(
    draw: st.DrawFn, transport: str, models: st.SearchStrategy[str], chat_model: str
) -> Malformed:
    what, key, value = draw(_sampling_fault())
    # Request parameters carry scalars only; Triton's ensembles do not pass them on.
    model = draw(models)
    as_parameter = _scalar(value) and re.fullmatch("[a-z_]+", key) is not None
    if as_parameter and model == chat_model and draw(st.booleans()):
        return Malformed(
            f"parameters/{what}",
            f"parameters.{key}",
            transport,
            model=chat_model,
            parameters={key: value},
        )
    raw = json.dumps({key: value}, allow_nan=True)
    return Malformed(
        f"sampling_parameters/{what}",
        f"sampling_parameters.{key}",
        transport,
        model=model,
        sampling_parameters=raw,
    )


def _sampling_json_case(
    draw: st.DrawFn, transport: str, models: st.SearchStrategy[str]
) -> Malformed:
    raw = draw(
        st.one_of(
            _TEXT.filter(lambda t: t.strip() != "" and _json_or_error(t) is _ERROR),
            _JSONISH.filter(lambda v: not isinstance(v, dict)).map(json.dumps),
        )
    )
    model = draw(models)
    return Malformed(
        "sampling_parameters/not_a_json_object",
        "sampling_parameters",
        transport,
        model=model,
        sampling_parameters=raw,
    )


def _context_case(
    draw: st.DrawFn, transport: str, models: st.SearchStrategy[str], chat_model: str
) -> Malformed:
    """The prompt's tokens + max_tokens must fit the context; the error names the key in
    the tensor's spelling (it is checked after tokenising, in every engine)."""
    if draw(st.booleans()):
        max_tokens = draw(st.integers(CONTEXT, 2**62))
        return Malformed(
            "context/max_tokens_beyond_context",
            "sampling_parameters.max_tokens",
            transport,
            model=draw(models),
            sampling_parameters=json.dumps({"max_tokens": max_tokens}),
        )
    token = draw(st.integers(10**6, INT64[1]))
    return Malformed(
        "context/stop_token_id_beyond_vocabulary",
        "sampling_parameters.stop_token_ids",
        transport,
        model=chat_model,
        sampling_parameters=json.dumps({"stop_token_ids": [token]}),
    )


def _prompt_case(draw: st.DrawFn, transport: str, model: str) -> Malformed:
    choice = draw(st.sampled_from(("empty", "too_long", "two_forms")))
    if choice == "empty":
        blank = draw(st.text(st.sampled_from(" \t\n\r"), max_size=4))
        return Malformed("prompt/empty", "text_input", transport, model, text_input=blank)
    if choice == "too_long":
        text = "word " * draw(st.integers(2100, 2600))
        return Malformed("prompt/too_long", "text_input", transport, model, text_input=text)
    messages = json.dumps([{"role": "user", "content": "hi"}])
    return Malformed("prompt/text_and_messages", "text_input", transport, model, messages=messages)


@st.composite
def malformed_requests(
    draw: st.DrawFn, models: Sequence[str] = (LLM, ENSEMBLE), chat_model: str = LLM
) -> Malformed:
    """One malformed request; hypothesis varies the fault, its value and the transport.

    Prompt and chat faults go to ``chat_model`` (an ensemble takes text only and reports
    an empty prompt as its step's ``input_ids``); sampling faults go to any of ``models``.
    """
    to_any = st.sampled_from(list(models) or [chat_model])
    transport = draw(st.sampled_from(("http", "grpc")))
    family = draw(
        st.sampled_from(
            ("sampling", "sampling", "sampling", "sampling_json", "context", "prompt", "messages")
        )
    )
    if family == "sampling":
        return _sampling_case(draw, transport, to_any, chat_model)
    if family == "sampling_json":
        return _sampling_json_case(draw, transport, to_any)
    if family == "context":
        return _context_case(draw, transport, to_any, chat_model)
    if family == "prompt":
        return _prompt_case(draw, transport, chat_model)
    return _messages_fault(draw, transport, chat_model)


def _messages_fault(draw: st.DrawFn, transport: str, model: str) -> Malformed:
    choice = draw(st.sampled_from(("not_json", "not_a_list", "role", "content", "key", "item")))
    field = "messages"
    if choice == "not_json":
        raw = draw(_TEXT.filter(lambda t: _json_or_error(t) is _ERROR))
    elif choice == "not_a_list":
        raw = json.dumps(draw(st.one_of(st.just([]), _JSONISH.filter(_not_list_or_messages))))
    elif choice == "role":
        role = draw(_TEXT.filter(lambda r: r not in ("system", "user", "assistant", "tool")))
        raw, field = json.dumps([{"role": role, "content": "hi"}]), "messages[0].role"
    elif choice == "content":
        content = draw(_JSONISH.filter(lambda c: not isinstance(c, str)))
        raw, field = json.dumps([{"role": "user", "content": content}]), "messages[0].content"
    elif choice == "key":
        key = draw(
            st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz"), min_size=1, max_size=8).filter(
                lambda k: k not in ("role", "content", "name")
            )
        )
        raw = json.dumps([{"role": "user", "content": "hi", key: "x"}])
        field = f"messages[0].{key}"
    else:
        item = draw(_JSONISH.filter(lambda v: not isinstance(v, dict)))
        raw, field = json.dumps([item]), "messages[0]"
    return Malformed(f"messages/{choice}", field, transport, model, text_input=None, messages=raw)


_ERROR = object()


def _json_or_error(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return _ERROR


def _not_list_or_messages(value: Any) -> bool:
    return not isinstance(value, list) and not (isinstance(value, dict) and "messages" in value)


# --- sending them -----------------------------------------------------------------


@dataclass
class Answer:
    """What the server said to one malformed request, and whether that was right."""

    case: Malformed
    status: str  # "HTTP 400", "grpc error", ...
    message: str
    ready: bool
    ok: bool
    why: str = ""


def _grpc_inputs(case: Malformed) -> list[grpcclient.InferInput]:
    inputs = []
    for name in ("text_input", "messages", "sampling_parameters"):
        value = getattr(case, name)
        if value is not None:
            tensor = grpcclient.InferInput(name, [1], "BYTES")
            tensor.set_data_from_numpy(np.array([value.encode()], dtype=np.object_))
            inputs.append(tensor)
    return inputs


def _send_grpc(server: Server, case: Malformed, timeout_s: float) -> tuple[str, str]:
    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    try:
        client.async_stream_infer(
            case.model,
            _grpc_inputs(case),
            parameters=case.parameters,
            enable_empty_final_response=True,
        )
        result, error = events.get(timeout=timeout_s)
        if error is not None:
            return "grpc error", str(error.message())
        return "grpc response", str(result.get_response())[:200]
    except queue.Empty:
        return "grpc no answer", f"nothing within {timeout_s:.0f} s"
    finally:
        with contextlib.suppress(InferenceServerException):
            client.stop_stream(cancel_requests=True)
        client.close()


def _send_http(server: Server, case: Malformed, timeout_s: float) -> tuple[str, str]:
    url = f"http://{server.http_url}/v2/models/{case.model}/generate"
    reply = requests.post(url, json=case.http_body(), timeout=timeout_s)
    try:
        message = str(reply.json().get("error", reply.text))
    except ValueError:
        message = reply.text
    return f"HTTP {reply.status_code}", message


def model_ready(server: Server, model: str) -> bool:
    with contextlib.suppress(requests.RequestException):
        url = f"http://{server.http_url}/v2/models/{model}/ready"
        return requests.get(url, timeout=10).status_code == 200
    return False


def send(server: Server, case: Malformed, timeout_s: float = 60.0) -> Answer:
    """Send ``case`` and judge the answer: refused, right code, field named, still ready."""
    sender = _send_http if case.transport == "http" else _send_grpc
    status, message = sender(server, case, timeout_s)
    ready = model_ready(server, case.model)
    refused = status.startswith("HTTP 4") if case.transport == "http" else status == "grpc error"
    why = []
    if not refused:
        why.append(f"not refused as a client error ({status})")
    if printable(case.field) not in message:  # as the server names it: NUL escaped
        why.append(f"the error does not name {case.field!r}")
    if not ready:
        why.append(f"{case.model} is no longer ready")
    return Answer(case, status, message, ready, not why, "; ".join(why))


def greedy_answer(server: Server, model: str = LLM) -> str:
    """``model``'s greedy answer to a fixed prompt (derived on this machine, never fixed)."""
    body: dict[str, Any] = {
        "text_input": GREEDY_PROMPT,
        "exclude_input_in_output": True,
        "parameters": GREEDY,
    }
    reply = requests.post(
        f"http://{server.http_url}/v2/models/{model}/generate", json=body, timeout=120
    ).json()
    if "text_output" not in reply:
        raise RuntimeError(f"the greedy reference request failed: {reply}")
    return reply["text_output"]


def _storm(
    server: Server, examples: int, seed: int | None, cases: st.SearchStrategy[Malformed]
) -> tuple[list[Answer], str]:
    """Send ``examples`` cases until one is answered wrongly; the answers and that failure.

    hypothesis stops at the first request answered wrongly and shrinks it to the
    simplest request that still is; that request and the server's answer are the failure.
    """
    answers: list[Answer] = []

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=False,
        phases=(Phase.generate, Phase.shrink),
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @given(case=cases)
    def refused_by_name(case: Malformed) -> None:
        answer = send(server, case)
        answers.append(answer)
        assert answer.ok, answer.why

    run = refused_by_name if seed is None else _seeded(refused_by_name, seed)
    try:
        run()
    except AssertionError:
        bad = next((a for a in reversed(answers) if not a.ok), None)
        if bad is None:
            return answers, "hypothesis reported a failure"
        return answers, f"{bad.why}: {bad.case} -> {bad.status}: {bad.message[:300]}"
    return answers, ""


def _storm_figures(answers: list[Answer], before: str, after: str) -> dict[str, Any]:
    tally: dict[str, int] = {}
    for answer in answers:
        key = f"{answer.case.transport} {answer.case.what} -> {answer.status}"
        tally[key] = tally.get(key, 0) + 1
    return {
        "sent": len(answers),
        "refused_by_name": sum(a.ok for a in answers),
        "over_http": sum(a.case.transport == "http" for a in answers),
        "over_grpc": sum(a.case.transport == "grpc" for a in answers),
        "http_statuses": sorted({a.status for a in answers if a.case.transport == "http"}),
        "faults": len({a.case.what for a in answers}),
        "by_fault": dict(sorted(tally.items())),
        "greedy_before": before,
        "greedy_after": after,
        "greedy_unchanged": after == before,
    }


def malformed_storm(
    server: Server,
    examples: int = 200,
    seed: int | None = None,
    models: Sequence[str] = (LLM, ENSEMBLE),
    chat_model: str = LLM,
) -> Scenario:
    """``examples`` generated malformed requests; the server must refuse each by name.

    Sampling faults go to any of ``models``, prompt and chat faults to ``chat_model``,
    whose greedy answer is compared before and after. ``seed`` fixes the examples (None:
    new ones each run).
    """
    started = time.monotonic()
    before = greedy_answer(server, chat_model)
    answers, failure = _storm(server, examples, seed, malformed_requests(models, chat_model))
    after = greedy_answer(server, chat_model)
    served = {a.case.model for a in answers} | {chat_model}
    ready = all(model_ready(server, m) for m in served)
    failures = [failure] if failure else []
    if len(answers) < examples:
        failures.append(f"only {len(answers)} of {examples} requests were generated and sent")
    if not ready:
        failures.append("a model was not ready after the storm")
    if after != before:
        failures.append(f"greedy answer changed: {before!r} -> {after!r}")
    criteria = [
        f">= {examples} hypothesis-generated malformed requests over HTTP and gRPC",
        "each refused (HTTP 4xx / gRPC error) with a message naming the broken field",
        "the model ready after each request and after the storm",
        "the greedy answer to a fixed prompt unchanged (taken on this server before)",
    ]
    figures = _storm_figures(answers, before, after) | {"hypothesis_seed": seed}
    return judged("malformed_storm", criteria, figures, failures, started)


def _seeded(test: Any, seed: int) -> Any:
    from hypothesis import seed as fixed_seed

    return fixed_seed(seed)(test)
