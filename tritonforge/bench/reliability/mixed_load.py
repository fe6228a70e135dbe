"""Sustained mixed load: every kind of request at once, none may fail, memory must settle.

``concurrency`` workers send requests back to back — gRPC streamed and single, HTTP
``/generate`` and ``/generate_stream``, structured outputs — chosen by a seeded random
generator, so a run can be repeated, while the server's process group's RSS is sampled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import psutil

from tritonforge.bench.reliability.clients import (
    Clients,
    GrpcStream,
    Outcome,
    Server,
    grpc_request,
    http_generate,
)
from tritonforge.bench.reliability.models import ENSEMBLE, LLM
from tritonforge.bench.reliability.probes import tree_rss
from tritonforge.bench.reliability.verdict import Scenario, judged, outcome_figures

PROMPTS = (
    "Write a short note to a colleague about the planning meeting on Thursday.",
    "Explain in two sentences why the sky is blue.",
    "List three things to pack for a weekend hiking trip.",
    "Once upon a time, in a small village by the sea,",
    "Describe the taste of a fresh orange to someone who has never had one.",
    "What are the advantages of learning a second language?",
    "Summarise the plot of a detective story in one paragraph.",
    "Give a recipe idea that uses rice, eggs and spinach.",
)


def _json_or_none(text: str) -> Any:
    with contextlib.suppress(ValueError):
        return json.loads(text)
    return None


#: Structured outputs the mixed load asks for, each with the check its text must pass
#: when generation stopped by itself: a constraint the engine ignored shows as a failed
#: request. A text cut by max_tokens (finish_reason "length") cannot be complete JSON and
#: is counted apart, not failed: vLLM's JSON grammar allows any whitespace between
#: tokens, and a small model can spend its budget on newlines (vLLM 0.32 does not read
#: the per-request ``disable_any_whitespace``, only the engine-wide setting).
STRUCTURED: tuple[tuple[str, dict[str, Any], int, Callable[[str], bool]], ...] = (
    ("choice", {"choice": ["yes", "no", "maybe"]}, 4, lambda t: t in ("yes", "no", "maybe")),
    ("regex", {"regex": "[0-9]{3}"}, 8, lambda t: re.fullmatch("[0-9]{3}", t) is not None),
    (
        "json",
        {
            "json": {
                "type": "object",
                "properties": {"ok": {"type": "boolean"}},
                "required": ["ok"],
                "additionalProperties": False,
            },
            "disable_any_whitespace": True,
        },
        32,
        lambda t: isinstance(_json_or_none(t), dict) and isinstance(_json_or_none(t)["ok"], bool),
    ),
)
KINDS = ("grpc_stream", "grpc_single", "http_generate", "http_stream", "structured")


def _sampling(rng: random.Random, max_tokens: int) -> dict[str, Any]:
    greedy = rng.random() < 0.5
    sampling: dict[str, Any] = {"max_tokens": max_tokens, "min_tokens": 1}
    sampling |= {"temperature": 0} if greedy else {"temperature": 0.8, "seed": rng.randrange(1000)}
    return sampling


async def _plain_request(
    clients: Clients,
    rng: random.Random,
    model: str,
    kind: str,
    prompt: str,
    sampling: dict[str, Any],
    chat_models: Sequence[str],
) -> Outcome:
    """A gRPC (streamed or single) or HTTP (``/generate`` or its stream) request."""
    if kind in ("grpc_stream", "grpc_single"):
        inputs: dict[str, str | bytes | bool] = {
            "text_input": prompt,
            "sampling_parameters": json.dumps(sampling),
            "stream": kind == "grpc_stream",
            "exclude_input_in_output": True,
        }
        if model in chat_models and rng.random() < 0.3:  # the chat form, where it is served
            del inputs["text_input"]
            inputs["messages"] = json.dumps([{"role": "user", "content": prompt}])
        stream = GrpcStream(clients.channel(), grpc_request(model, inputs))
        return await stream.run(kind)
    body = {
        "text_input": prompt,
        "sampling_parameters": json.dumps(sampling),
        "exclude_input_in_output": True,
    }
    if kind == "http_stream":
        body["stream"] = True
    return await http_generate(
        clients.session, clients.server, model, body, stream=kind == "http_stream", kind=kind
    )


async def _structured_request(
    clients: Clients, rng: random.Random, model: str, kind: str, prompt: str
) -> Outcome:
    """A structured-output request whose text must pass its constraint's check."""
    name, constraint, max_tokens, check = rng.choice(STRUCTURED)
    sampling = _sampling(rng, max_tokens) | {"structured_outputs": constraint}
    inputs: dict[str, str | bytes | bool] = {
        "text_input": f"{prompt} Answer:",
        "sampling_parameters": json.dumps(sampling),
        "stream": rng.random() < 0.5,
        "exclude_input_in_output": True,
        "return_finish_reason": True,
    }
    outcome = await GrpcStream(clients.channel(), grpc_request(model, inputs)).run(kind)
    if outcome.ok and outcome.finish_reason == "length":
        outcome.kind = "structured_cut_by_max_tokens"
    elif outcome.ok and not check(outcome.text.strip()):
        outcome.ok = False
        outcome.error = (
            f"structured output ({name}) violated, finish_reason {outcome.finish_reason!r}: "
            f"{outcome.text[:80]!r}"
        )
    return outcome


async def one_mixed_request(
    clients: Clients,
    rng: random.Random,
    models: Sequence[str],
    serial: int,
    chat_models: Sequence[str] = (LLM,),
) -> Outcome:
    """One request of a randomly chosen kind and model (seeded: a run can be repeated).

    ``chat_models``: the models among ``models`` that also take chat ``messages``.
    """
    model = rng.choice(models)
    kind = rng.choice(KINDS)
    prompt = f"{serial}. {rng.choice(PROMPTS)}"
    # Drawn for every kind, so the draws that follow do not depend on the kind chosen.
    sampling = _sampling(rng, rng.choice((16, 32, 48, 64)))
    if kind == "structured":
        return await _structured_request(clients, rng, model, kind, prompt)
    return await _plain_request(clients, rng, model, kind, prompt, sampling, chat_models)


def _rss_figures(
    rss: list[tuple[float, int, int]], duration_s: float, warmup_s: float
) -> tuple[dict[str, Any], float, bool]:
    """The RSS figures, the growth after warm-up and whether it spans any time at all."""
    under_load = [s for s in rss if s[0] <= duration_s]
    warm = next((s for s in under_load if s[0] >= warmup_s), under_load[-1])
    last = under_load[-1]
    growth = 100.0 * (last[1] - warm[1]) / warm[1]
    figures = {
        "rss_after_warmup_bytes": warm[1],
        "rss_at_end_bytes": last[1],
        "rss_growth_pct": round(growth, 2),
        "rss_window_s": [warm[0], last[0]],
        "server_processes": last[2],
        "rss_samples": rss,
    }
    return figures, growth, last[0] > warm[0]


async def _sample_rss(
    started: float,
    rss: list[tuple[float, int, int]],
    outcomes: list[Outcome],
    processes: Callable[[], list[psutil.Process]] | None,
    interval_s: float,
    progress: Callable[[str], None] | None,
) -> None:
    """Sample the process group's RSS into ``rss`` (and report progress) until cancelled."""
    last_report = 0.0
    while True:
        now = time.monotonic() - started
        if processes is not None and (found := processes()):
            rss.append((round(now, 1), *tree_rss(found)))
        if progress is not None and now - last_report >= 30:
            last_report = now
            failed = sum(not o.ok for o in outcomes)
            memory = f", server RSS {rss[-1][1] / 2**30:.2f} GiB" if rss else ""
            progress(f"{now:5.0f} s: {len(outcomes)} requests, {failed} failed{memory}")
        await asyncio.sleep(interval_s)


async def mixed_load(
    server: Server,
    *,
    models: Sequence[str] = (LLM, ENSEMBLE),
    concurrency: int = 64,
    duration_s: float = 300.0,
    warmup_s: float = 60.0,
    rss_limit_pct: float | None = 5.0,
    processes: Callable[[], list[psutil.Process]] | None = None,
    rss_interval_s: float = 5.0,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    chat_models: Sequence[str] = (LLM,),
) -> Scenario:
    """``concurrency`` workers send mixed requests back to back for ``duration_s``.

    Passes when no request failed (errors, broken constraints and hangs all count) and,
    with ``rss_limit_pct`` and ``processes`` given, when the server process group's RSS
    grew less than that between the end of the warm-up and the end of the load. Both
    RSS points are taken under full load, so they compare like with like; the warm-up
    lets the engine touch its KV cache and the allocators settle first.
    """
    started = time.monotonic()
    end = started + duration_s
    clients = Clients.open(server, concurrency)
    outcomes: list[Outcome] = []
    rss: list[tuple[float, int, int]] = []  # (seconds since start, bytes, processes)
    serial = iter(range(10**9))

    async def worker(index: int) -> None:
        rng = random.Random(seed * 1_000_003 + index)
        while time.monotonic() < end:
            request = one_mixed_request(clients, rng, models, next(serial), chat_models)
            outcomes.append(await request)

    sampler = asyncio.create_task(
        _sample_rss(started, rss, outcomes, processes, rss_interval_s, progress)
    )
    try:
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        await clients.close()
    return _mixed_verdict(
        outcomes, rss, started, models, concurrency, duration_s, warmup_s, rss_limit_pct, seed
    )


def _mixed_verdict(
    outcomes: list[Outcome],
    rss: list[tuple[float, int, int]],
    started: float,
    models: Sequence[str],
    concurrency: int,
    duration_s: float,
    warmup_s: float,
    rss_limit_pct: float | None,
    seed: int,
) -> Scenario:
    figures = outcome_figures(outcomes) | {
        "models": list(models),
        "concurrency": concurrency,
        "duration_s": duration_s,
        "warmup_s": warmup_s,
        "wall_s": round(time.monotonic() - started, 1),
        "seed": seed,
    }
    figures["requests_per_s"] = round(figures["requests"] / figures["wall_s"], 2)
    criteria = ["0 requests failed (errors, constraint violations, hangs)"]
    failures = [f"{o.model}/{o.kind}: {o.error}" for o in outcomes if not o.ok][:10]
    if rss:
        rss_figures, growth, spans = _rss_figures(rss, duration_s, warmup_s)
        figures |= rss_figures
        if rss_limit_pct is not None:
            criteria.append(f"server process-group RSS growth < {rss_limit_pct:g} % after warm-up")
            if not (growth < rss_limit_pct and spans):
                failures.append(
                    f"server RSS grew {growth:+.2f} % after warm-up (limit {rss_limit_pct:g} %)"
                )
    return judged("mixed_load", criteria, figures, failures, started)
