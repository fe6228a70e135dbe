"""The ten-minute storm's requests: every path a client takes, some cancelled, some malformed.

One request is drawn per call from a seeded generator, so a storm can be repeated: a
transport (gRPC stream or single response, HTTP ``/generate`` or ``/generate_stream``,
the OpenAI API streamed or not), a model, and whether the client cancels it at a random
moment or sends it malformed. Every well-formed request carries ``timeout_s`` — the
server's own deadline — so "it ends within its deadline" is a promise the server made,
not one the storm assumes; the client's own bound sits above it and only tells a hung
request from a slow one.

How it ended is one :class:`Ended`: answered, errored (with a short kind of error, so
errors can be counted by kind without keeping their texts), cancelled by the client, or
hung (no end within the client's bound). An OpenAI request also records when the first
part of its answer arrived — what tells a request that had sent nothing at the kill from
a started stream — and whether its client got anything twice (a replayed answer).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from tritonforge.bench.reliability.clients import (
    Clients,
    GrpcStream,
    Outcome,
    grpc_request,
    http_generate,
)
from tritonforge.bench.reliability.mixed_load import PROMPTS

TRITON_KINDS = ("grpc_stream", "grpc_single", "http_generate", "http_stream")
OPENAI_KINDS = ("openai_stream", "openai_single")
KINDS = (*TRITON_KINDS, *OPENAI_KINDS)
#: The client's bound above the request's own deadline: past it, the request hung.
HANG_MARGIN_S = 30.0


@dataclass(frozen=True)
class Draw:
    """What one request will be: decided before it is sent."""

    kind: str
    model: str
    max_tokens: int
    greedy: bool
    seed: int
    cancel_after_s: float | None  # the client cancels it this long after sending
    malformed: str | None  # which fault it carries (None: well-formed)


@dataclass
class Ended:
    """How one request ended, with when (monotonic) it started and ended."""

    kind: str
    model: str
    state: str  # answered | errored | cancelled | hung
    started: float
    ended: float
    error_kind: str = ""  # errored: a short kind (no prompt or output text)
    malformed: str | None = None
    first_at: float | None = None  # the first part of its answer arrived (OpenAI API)
    duplicated: bool = False  # its client got an answer, or its start or end, twice

    @property
    def seconds(self) -> float:
        return self.ended - self.started


#: Faults a malformed request carries, each with the field its refusal must name.
#: Triton's paths put them in ``sampling_parameters``; the OpenAI API in its body.
FAULTS: dict[str, tuple[dict[str, Any], str]] = {
    "negative_max_tokens": ({"max_tokens": -3}, "max_tokens"),
    "temperature_not_a_number": ({"temperature": "hot"}, "temperature"),
    "top_p_out_of_range": ({"top_p": 1.5}, "top_p"),
    "timeout_s_zero": ({"timeout_s": 0}, "timeout_s"),
}
_UNKNOWN_KEY = "temprature"  # a misspelt key: refused by name on Triton's paths


def draw(
    rng: random.Random,
    models: Sequence[str],
    cancel_share: float,
    malformed_share: float,
    cancel_within_s: float,
) -> Draw:
    """One request's shape; every draw is made whatever the earlier ones gave, so the
    sequence of a worker's requests depends on its seed alone."""
    kind, model = rng.choice(KINDS), rng.choice(models)
    max_tokens, greedy, seed = rng.choice((16, 32, 64)), rng.random() < 0.5, rng.randrange(1000)
    cancel, cancel_at = rng.random() < cancel_share, rng.uniform(0.0, cancel_within_s)
    bad, fault = rng.random() < malformed_share, rng.choice([*FAULTS, _UNKNOWN_KEY])
    if kind in OPENAI_KINDS and fault == _UNKNOWN_KEY:
        fault = "negative_max_tokens"  # the OpenAI API ignores keys it does not know
    return Draw(
        kind, model, max_tokens, greedy, seed, cancel_at if cancel else None, fault if bad else None
    )


def sampling(d: Draw, timeout_s: float) -> dict[str, Any]:
    """The request's sampling parameters, its fault (if any) written over them."""
    values: dict[str, Any] = {"max_tokens": d.max_tokens, "timeout_s": timeout_s}
    values |= {"temperature": 0} if d.greedy else {"temperature": 0.8, "seed": d.seed}
    if d.malformed == _UNKNOWN_KEY:
        values[_UNKNOWN_KEY] = 0.5
    elif d.malformed is not None:
        values |= FAULTS[d.malformed][0]
    return values


def fault_field(d: Draw) -> str | None:
    """The field a malformed request's refusal must name."""
    if d.malformed is None:
        return None
    return _UNKNOWN_KEY if d.malformed == _UNKNOWN_KEY else FAULTS[d.malformed][1]


async def triton_request(
    clients: Clients, d: Draw, prompt: str, bound_s: float, timeout_s: float
) -> Outcome:
    """A gRPC or HTTP request to Triton's own endpoints; its :class:`Outcome`."""
    params = json.dumps(sampling(d, timeout_s))
    if d.kind.startswith("grpc"):
        inputs: dict[str, str | bytes | bool] = {
            "text_input": prompt,
            "sampling_parameters": params,
            "stream": d.kind == "grpc_stream",
            "exclude_input_in_output": True,
        }
        stream = GrpcStream(clients.channel(), grpc_request(d.model, inputs))
        return await stream.run(d.kind, timeout_s=bound_s)
    body: dict[str, Any] = {"text_input": prompt, "sampling_parameters": params}
    body |= {"exclude_input_in_output": True} | (
        {"stream": True} if d.kind == "http_stream" else {}
    )
    return await http_generate(
        clients.session,
        clients.server,
        d.model,
        body,
        stream=d.kind == "http_stream",
        kind=d.kind,
        timeout_s=bound_s,
    )


def openai_body(d: Draw, prompt: str, timeout_s: float) -> tuple[str, dict[str, Any]]:
    """The route and body of an OpenAI request: chat for a model that takes chat
    ``messages``, a completion for one that takes a prompt (the ensemble)."""
    body: dict[str, Any] = {"model": d.model, "stream": d.kind == "openai_stream"}
    body |= sampling(d, timeout_s)
    if d.model == "vllm_model":
        return "chat/completions", body | {"messages": [{"role": "user", "content": prompt}]}
    return "completions", body | {"prompt": prompt}


def _message(error: Any) -> str:
    """An OpenAI error body's message (the whole body if it has none)."""
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"][:300]
    return json.dumps(error)[:300]


def _choice_marks(event: dict[str, Any]) -> tuple[int, int]:
    """A stream chunk's beginnings (a ``role`` delta, chat) and ends (a finish reason)."""
    starts = ends = 0
    for choice in event.get("choices") or []:
        starts += bool((choice.get("delta") or {}).get("role"))
        ends += choice.get("finish_reason") is not None
    return starts, ends


async def _read_openai(reply: aiohttp.ClientResponse, stream: bool, outcome: Outcome) -> None:
    """An OpenAI answer: one JSON body, or SSE events until ``[DONE]`` — read to the end
    of the body, so an event after ``[DONE]`` (a second answer) would be seen."""
    if reply.status != 200 or not stream:
        answer = await reply.json(content_type=None)
        error = answer.get("error") if isinstance(answer, dict) else None
        if reply.status != 200 or error:
            outcome.error = f"HTTP {reply.status}: {_message(error or answer)}"
        else:
            outcome.first_at = time.monotonic()
            outcome.duplicated = len(answer.get("choices") or []) != 1
        outcome.responses = 1
        return
    starts = ends = 0
    done = False
    async for line in reply.content:
        if not line.startswith(b"data: "):
            continue
        if done:
            outcome.duplicated = True  # anything after [DONE]
        if line.strip() == b"data: [DONE]":
            done = True
            continue
        event = json.loads(line[6:])
        outcome.responses += 1
        if "error" in event:
            outcome.error = f"HTTP 200: stream error {_message(event['error'])}"
            continue
        if outcome.first_at is None:
            outcome.first_at = time.monotonic()
        began, ended = _choice_marks(event)
        starts, ends = starts + began, ends + ended
    outcome.duplicated = outcome.duplicated or starts > 1 or ends > 1
    if not done:
        outcome.error = outcome.error or "the stream ended without [DONE]"


async def openai_request(
    session: aiohttp.ClientSession,
    base_url: str,
    d: Draw,
    prompt: str,
    bound_s: float,
    timeout_s: float,
) -> Outcome:
    """One request through the OpenAI frontend; its :class:`Outcome` (text not kept)."""
    route, body = openai_body(d, prompt, timeout_s)
    outcome = Outcome(d.kind, d.model, False, 0.0)
    start = time.monotonic()
    try:
        async with (
            asyncio.timeout(bound_s),
            session.post(
                f"{base_url}/{route}", json=body, timeout=aiohttp.ClientTimeout(None)
            ) as reply,
        ):
            await _read_openai(reply, body["stream"], outcome)
            outcome.ok = outcome.error is None
    except TimeoutError:
        outcome.hung, outcome.error = True, f"no end within {bound_s:.0f} s"
    except (aiohttp.ClientError, ValueError) as error:
        outcome.error = f"{type(error).__name__}: {error}"
    outcome.ended_at = time.monotonic()
    outcome.seconds = outcome.ended_at - start
    return outcome


_CODE = re.compile(r"^(HTTP \d+|[A-Z_]{4,}|[A-Za-z]+(?:Error|Exception)):?")
_GOING_AWAY = ("shutting down", "being restarted", "unloaded", "not reachable")


def error_kind(error: str, d: Draw) -> str:
    """A short kind for an error: its status or class and the first words of its message,
    numbers folded, and for a malformed request whether the refusal named the field.

    Error messages name fields and rules, never a prompt or an output, so a few of their
    words are safe to keep; they tell "connection refused" from "the server is shutting
    down" where the status alone cannot.
    """
    if "no end within" in error:
        return "hung"
    found = _CODE.match(error)
    code = found.group(1) if found else "error response"
    rest = error[found.end() :] if found else error
    words = " ".join(re.sub(r"[0-9]+", "N", rest).replace('"', "").split()[:6])
    kind = f"{code}: {words}"[:80]
    wanted = fault_field(d)
    if wanted is None or error.startswith(("HTTP 503", "UNAVAILABLE", "Client", "Server")):
        return kind
    if any(what in error for what in _GOING_AWAY):
        return kind
    return f"malformed, refused naming {wanted}" if wanted in error else f"malformed: {kind}"


async def bounded(d: Draw, work: Awaitable[Outcome]) -> Ended:
    """Run ``work``; cancel it after ``d.cancel_after_s`` (if set); how it ended."""
    started = time.monotonic()
    task = asyncio.ensure_future(work)
    cancelling = False
    if d.cancel_after_s is not None:
        done, _ = await asyncio.wait({task}, timeout=d.cancel_after_s)
        if not done:
            cancelling = task.cancel()
    try:
        outcome = await task
    except asyncio.CancelledError:
        if not cancelling:
            raise  # the storm itself is being cancelled
        return Ended(d.kind, d.model, "cancelled", started, time.monotonic(), malformed=d.malformed)
    except Exception as error:  # a client bug must still count, not vanish
        return Ended(
            d.kind, d.model, "errored", started, time.monotonic(), f"client {type(error).__name__}"
        )
    state = "hung" if outcome.hung else "answered" if outcome.ok else "errored"
    kind = error_kind(outcome.error or "", d) if state != "answered" else ""
    return Ended(
        d.kind,
        d.model,
        state,
        started,
        time.monotonic(),
        kind,
        d.malformed,
        outcome.first_at,
        outcome.duplicated,
    )


async def one_request(
    clients: Clients, openai_url: str, d: Draw, serial: int, timeout_s: float
) -> Ended:
    """Send the request ``d`` describes (the ``serial``-th), bounded and maybe cancelled."""
    prompt = f"{serial}. {PROMPTS[serial % len(PROMPTS)]}"
    bound_s = timeout_s + HANG_MARGIN_S
    if d.kind in OPENAI_KINDS:
        work = openai_request(clients.session, openai_url, d, prompt, bound_s, timeout_s)
    else:
        work = triton_request(clients, d, prompt, bound_s, timeout_s)
    return await bounded(d, work)
