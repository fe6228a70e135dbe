"""Past saturation beside the peers: each Triton model against its engine's own server.

Why: SLO admission is worth running Triton for only if, on the same engine settings, it
keeps more requests within their SLO than the engine's own server does when both are
overloaded. Two pairs, each sharing one engine configuration file:

- ``vllm``: ``vllm_slo_model`` through Triton (admission on, a priority queue) against
  vLLM's own server on the same model.json (it has no admission);
- ``llamacpp``: ``llamacpp_model`` through Triton against llama.cpp's own server
  (llama-cpp-python's) on the same GGUF, context and threads
  (:class:`tritonforge.bench.services.LlamaCppServerService` says why that server).

Every server is up at once; each round sends both sides of a pair the *same* Poisson
arrivals (same seed, prompts and lengths) at ``multiple`` x S, and the four cells of a
round run in an order rotated per round. S, the saturation rate of a pair, is the Triton
side's: given (``--saturation vllm=0.8,llamacpp=1``) or swept here (``--sweep``: each
pair's rates in ascending order, one cell each, until the share of requests within the SLO
falls below the contract's ``load.saturation.min_goodput_share``). Requests carry the
contract's SLO as their own ``slo_ttft_ms`` / ``slo_tpot_ms`` (a peer ignores them).

    python -m tritonforge.bench peers --sweep vllm=0.4/0.6/0.8,llamacpp=0.3/0.5/0.7 \
        --duration-s 40 --rounds 3

Results: perf/results/overload-peers/<UTC>/results.json, and verdicts.json with each
pair's verdict (goodput ratio per round against the pair's target, judged as every
contract target is) in the shape ``overload-report`` writes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tritonforge.bench.contract import Contract, load_contract
from tritonforge.bench.noise import RoundWatch, all_quiet
from tritonforge.bench.overload import (
    DRAIN_S,
    Arrival,
    Outcome,
    driver_priority,
    environment,
    one,
    schedule,
    summary,
)
from tritonforge.bench.overload_report import gain, row
from tritonforge.bench.run_plan import rotated
from tritonforge.bench.services import (
    LlamaCppServerService,
    VllmOpenAIService,
    end_of_generation_ids,
)
from tritonforge.bench.workload import PromptBuilder
from tritonforge.launch.launcher import TritonServer
from tritonforge.paths import CACHE_DIR, REPO_ROOT, make_machine_free

RESULTS_ROOT = REPO_ROOT / "perf/results/overload-peers"


@dataclass(frozen=True)
class Pair:
    """A Triton model and its engine's own server, on one engine configuration."""

    name: str
    triton_model: str
    peer: str  # "vllm serve" or "llama.cpp server"
    min_ratio: float  # Triton's goodput / the peer's, per round, the target

    @property
    def engine_config(self) -> Path:
        return REPO_ROOT / "model_repository" / self.triton_model / "1" / "model.json"


PAIRS = {
    "vllm": Pair("vllm", "vllm_slo_model", "vllm serve", 3.0),
    "llamacpp": Pair("llamacpp", "llamacpp_model", "llama.cpp server", 0.95),
}


def completion_body(arrival: Arrival, served: str, extra: dict[str, Any]) -> dict[str, Any]:
    """The arrival's request as an OpenAI streamed completion for a peer server.

    Same prompt and ``max_tokens``, greedy; ``extra`` forces the full length the way the
    peer can (``ignore_eos`` for vLLM, a logit bias against end-of-generation for
    llama.cpp). Usage is asked for so the count is of tokens that arrived.
    """
    parameters = arrival.body["parameters"]
    return {
        "model": served,
        "prompt": arrival.body["text_input"],
        "max_tokens": parameters["max_tokens"],
        "temperature": parameters["temperature"],
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }


def count_event(event: dict[str, Any], outcome: Outcome) -> None:
    """Add one completion chunk's tokens to ``outcome``.

    A chunk with text is one token (both peers stream a token per chunk); a final usage
    chunk, when the server sends one, replaces the count with its ``completion_tokens``.
    """
    usage = event.get("usage")
    if usage and usage.get("completion_tokens") is not None:
        outcome.tokens = int(usage["completion_tokens"])
        return
    if any(choice.get("text") for choice in event.get("choices", [])):
        outcome.tokens += 1


async def one_completion(
    http: httpx.AsyncClient, url: str, body: dict[str, Any], outcome: Outcome
) -> None:
    """Send one streamed completion at its arrival; fill ``outcome`` from its chunks."""
    start = time.perf_counter()
    try:
        async with http.stream("POST", url, json=body) as reply:
            if reply.status_code != 200:
                outcome.error = (await reply.aread()).decode(errors="replace")[:200]
                outcome.e2e_s = time.perf_counter() - start
                return
            async for line in reply.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    outcome.error = str(event["error"])[:200]
                    continue
                count_event(event, outcome)
                if outcome.ttft_s is None and outcome.tokens:
                    outcome.ttft_s = time.perf_counter() - start
        outcome.e2e_s = time.perf_counter() - start
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        outcome.error = repr(exc)[:200]


@dataclass
class Side:
    """One side of a pair: where its requests go and how they are written."""

    label: str
    url: str
    served: str | None = None  # None: Triton's generate_stream takes the arrival's body
    extra: dict[str, Any] | None = None


async def send_all(side: Side, arrivals: list[Arrival]) -> list[Outcome]:
    """Send ``arrivals`` at their times; await each, cancelling those past DRAIN_S."""
    outcomes = [Outcome(a.at, a.measured, a.asked) for a in arrivals]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        begin, tasks = time.perf_counter(), []
        for arrival, outcome in zip(arrivals, outcomes, strict=True):
            await asyncio.sleep(max(begin + arrival.at - time.perf_counter(), 0))
            if side.served is None:
                coro = one(http, side.url, arrival.body, outcome)
            else:
                body = completion_body(arrival, side.served, side.extra or {})
                coro = one_completion(http, side.url, body, outcome)
            tasks.append(asyncio.create_task(coro))
        _, pending = await asyncio.wait(tasks, timeout=DRAIN_S) if tasks else ((), ())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    for outcome in outcomes:
        if outcome.e2e_s is None and outcome.error is None and not outcome.refused:
            outcome.error = "unfinished"
    return outcomes


def measure(
    side: Side, contract: Contract, prompts: PromptBuilder, rate: float, args: Any, seed: int
) -> dict[str, Any]:
    """One cell: ``rate`` req/s of the contract's mix on one side, with its noise."""
    with RoundWatch() as watch:
        arrivals = schedule(contract, prompts, rate, args.warmup_s, args.duration_s, seed)
        outcomes = asyncio.run(send_all(side, arrivals))
    assert watch.sample is not None
    figures = summary(outcomes, contract, args.duration_s)
    measured = max(figures["offered"], 1)
    good = figures["goodput_rps"] * args.duration_s
    return {
        "side": side.label,
        "rate_rps": rate,
        **figures,
        "goodput_share": good / measured,
        "error_kinds": error_kinds(outcomes),
        "noise": watch.sample.model_dump(),
    }


def error_kinds(outcomes: Sequence[Outcome]) -> dict[str, int]:
    """How the measured requests that failed failed: their errors' first 60 characters."""
    kinds: dict[str, int] = {}
    for outcome in outcomes:
        if outcome.measured and outcome.error:
            kinds[outcome.error[:60]] = kinds.get(outcome.error[:60], 0) + 1
    return kinds


def sweep(
    side: Side, contract: Contract, prompts: PromptBuilder, rates: Sequence[float], args: Any
) -> tuple[float | None, list[dict[str, Any]]]:
    """The highest of ``rates`` (ascending) at which the share within SLO holds; the cells."""
    rule = contract.load.saturation_rule
    share = rule.min_goodput_share if rule else 0.9
    held, cells = None, []
    for i, rate in enumerate(sorted(rates)):
        cell = measure(side, contract, prompts, rate, args, seed=500 + i)
        cells.append(cell)
        print(json.dumps({"sweep": side.label, **cell}))
        if cell["goodput_share"] < share:
            break
        held = rate
    return held, cells


def verdict(pair: Pair, cells: list[dict[str, Any]], max_foreign: float) -> dict[str, Any]:
    """The pair's goodput ratio per round (Triton / peer) against its target."""
    by_round: dict[int, dict[str, float]] = {}
    for cell in cells:
        by_round.setdefault(cell["round"], {})[cell["side"]] = cell["goodput_rps"]
    ratios = [
        gain(sides["triton"], sides["peer"])
        for _, sides in sorted(by_round.items())
        if {"triton", "peer"} <= sides.keys()
    ]
    quiet = all_quiet((c["noise"]["foreign_cpu_share_during"] for c in cells), max_foreign)
    text = f"{pair.triton_model} through Triton / {pair.peer}: goodput >= {pair.min_ratio:g}x"
    return {"pair": pair.name, **row(text, ratios, pair.min_ratio, True, quiet)}


class PeerServers:
    """Triton with the pairs' models, and each pair's own server: all up at once."""

    def __init__(self, pairs: Sequence[Pair], out: Path, served: str) -> None:
        self.triton = TritonServer.on_free_ports(
            models=[p.triton_model for p in pairs], log_path=out / "tritonserver.log"
        )
        self.peers: dict[str, VllmOpenAIService | LlamaCppServerService] = {}
        for pair in pairs:
            log = out / f"{pair.name}-peer.log"
            if pair.name == "vllm":
                self.peers[pair.name] = VllmOpenAIService(pair.engine_config, served, log)
            else:
                self.peers[pair.name] = LlamaCppServerService(pair.engine_config, served, log)
        self.served = served
        self.startup_s: dict[str, float] = {}

    def __enter__(self) -> PeerServers:
        began = time.monotonic()
        self.triton.start()
        for peer in self.peers.values():
            peer.start()
        try:
            self.triton.wait_ready()
            self.startup_s["triton"] = time.monotonic() - began
            for name, peer in self.peers.items():
                peer.wait_ready()
                self.startup_s[name] = time.monotonic() - began
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for peer in self.peers.values():
            peer.stop()
        self.triton.stop()

    def sides(self, pair: Pair) -> tuple[Side, Side]:
        triton = Side(
            "triton", f"http://{self.triton.http_url}/v2/models/{pair.triton_model}/generate_stream"
        )
        peer = self.peers[pair.name]
        if isinstance(peer, LlamaCppServerService):
            model_dir = Path(str(peer.settings()["model_path"])).parent
            extra: dict[str, Any] = {
                "logit_bias": {str(i): -100 for i in end_of_generation_ids(model_dir)}
            }
        else:
            extra = {"ignore_eos": True}
        url = f"http://127.0.0.1:{peer.port}/v1/completions"
        return triton, Side("peer", url, self.served, extra)


def parse_rates(text: str | None, flag: str = "--saturation") -> dict[str, list[float]]:
    """``vllm=0.8,llamacpp=0.5/1`` → {pair: [rates]}; a pair named twice or unknown is an
    error naming ``flag``."""
    rates: dict[str, list[float]] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, sep, values = item.partition("=")
        name = name.strip()
        if not sep or name not in PAIRS or name in rates:
            raise ValueError(f"{flag}: {item!r} is not pair=rate[/rate…], pairs {list(PAIRS)}")
        rates[name] = [float(v) for v in values.split("/")]
    return rates


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--contract", type=Path, default=REPO_ROOT / "perf/contracts/overload.yaml")
    parser.add_argument("--pairs", default="vllm,llamacpp", help=f"some of {list(PAIRS)}")
    parser.add_argument("--saturation", help="S per pair, e.g. vllm=0.8,llamacpp=1 (req/s)")
    parser.add_argument(
        "--sweep", help="rates per pair to find S on the Triton side: vllm=0.4/0.6,llamacpp=0.5/1"
    )
    parser.add_argument(
        "--sweep-duration-s", type=float, help="each swept rate (default --duration-s)"
    )
    parser.add_argument("--multiple", type=float, help="default: the contract's at_multiple")
    parser.add_argument("--duration-s", type=float, help="default: the contract's")
    parser.add_argument("--warmup-s", type=float, help="default: the contract's")
    parser.add_argument("--rounds", type=int, help="default: the contract's")


def main(args: argparse.Namespace) -> int:
    contract, digest = load_contract(args.contract)
    if contract.overload is None:
        raise ValueError(f"{args.contract}: the contract has no overload section")
    pairs = [PAIRS[name] for name in args.pairs.split(",")]
    given = {name: rates[0] for name, rates in parse_rates(args.saturation).items()}
    grids = parse_rates(args.sweep, "--sweep")
    if missing := {p.name for p in pairs} - set(given) - set(grids):
        raise ValueError(f"give --saturation or --sweep rates for {sorted(missing)}")
    args.multiple = args.multiple or contract.overload.targets.at_multiple
    args.duration_s = args.duration_s or contract.overload.duration_s
    args.warmup_s = contract.overload.warmup_s if args.warmup_s is None else args.warmup_s
    args.rounds = args.rounds or contract.overload.rounds
    env = environment()
    prompts = PromptBuilder.for_model(CACHE_DIR / "models" / contract.model)
    out = RESULTS_ROOT / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out.mkdir(parents=True)
    sweeps: dict[str, list[dict[str, Any]]] = {}
    cells: list[dict[str, Any]] = []
    notes: list[str] = []
    with PeerServers(pairs, out, contract.model) as servers:
        scheduling = driver_priority()
        rates = dict(given)
        for pair in pairs:
            if pair.name not in rates:
                triton, _ = servers.sides(pair)
                swept = argparse.Namespace(
                    warmup_s=args.warmup_s, duration_s=args.sweep_duration_s or args.duration_s
                )
                held, sweeps[pair.name] = sweep(triton, contract, prompts, grids[pair.name], swept)
                if held is None:  # S is below the lowest rate: the cells say how far past it
                    notes.append(f"{pair.name}: no swept rate held; S taken as the lowest")
                rates[pair.name] = held or min(grids[pair.name])
        runs = [(pair, side) for pair in pairs for side in servers.sides(pair)]
        for round_index in range(args.rounds):
            for pair, side in rotated(runs, round_index):
                seed = 1000 * round_index + list(PAIRS).index(pair.name)
                rate = args.multiple * rates[pair.name]
                cell = measure(side, contract, prompts, rate, args, seed)
                cell |= {"round": round_index, "pair": pair.name, "model": pair.triton_model}
                cells.append(cell)
                print(json.dumps(cell))
        startup = servers.startup_s
    max_foreign = contract.load.max_foreign_cpu_share
    verdicts = [verdict(p, [c for c in cells if c["pair"] == p.name], max_foreign) for p in pairs]
    results = {
        "contract": str(args.contract.resolve().relative_to(REPO_ROOT)),
        "contract_sha256": digest,
        "reduced": args.duration_s < contract.overload.duration_s
        or args.rounds < contract.overload.rounds
        or args.warmup_s < contract.overload.warmup_s,
        "settings": {
            k: v for k, v in vars(args).items() if k not in ("contract", "func", "command")
        },
        "environment": env,
        "driver_scheduling": scheduling,
        "startup_s": startup,
        "saturation_rps": rates,
        "sweeps": sweeps,
        "notes": notes,
        "cells": cells,
        "verdicts": verdicts,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    # the shape overload-report writes, so a decision record reads both alike
    quiet = all_quiet((c["noise"]["foreign_cpu_share_during"] for c in cells), max_foreign)
    verdict_file = {"machine_quiet": quiet, "targets": verdicts}
    (out / "verdicts.json").write_text(json.dumps(verdict_file, indent=1) + "\n")
    make_machine_free(out)
    print(json.dumps(verdicts, indent=1))
    print(f"wrote {out / 'results.json'}")
    return 0
