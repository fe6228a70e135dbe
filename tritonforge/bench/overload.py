"""Overload runs of perf/contracts/overload.yaml: SLO admission on vs off past saturation.

Why: goodput under overload is what admission is for, and only an open-loop run past
the saturation rate shows it. One tritonserver serves the contract's model twice,
``<model>_on`` (config.pbtxt ``admission: on``) and ``<model>_off`` (``observe``: the
same predictor and metrics, nothing refused), so the two modes interleave without
restarts. Requests are the contract's short-chat mix over HTTP ``generate_stream``,
Poisson arrivals, each carrying the contract's SLO as its own ``slo_ttft_ms`` /
``slo_tpot_ms``.

The saturation rate S is the tool's own: ``python -m tritonforge.bench run`` on the same
contract sweeps its ``load.request_rates`` and judges the point by
:mod:`tritonforge.bench.saturation`; this driver takes S and the sweep's peak goodput
from that run (``--saturation-from``; an earlier overload run works too) or from
``--saturation``:

    python -m tritonforge.bench run --contract perf/contracts/overload.yaml
    python -m tritonforge.bench overload --saturation-from perf/results/overload/<sweep run>
    python -m tritonforge.bench overload-report perf/results/overload/<UTC>

Then the overload cells at each multiple, modes alternating and the order rotated per
round. ``--duration-s``/``--warmup-s``/``--rounds`` below the contract's make a reduced
run, and ``--multiples`` (some of the contract's) a partial one; the results say both.
Results: perf/results/overload/<UTC>/results.json (logs without this machine's paths);
:mod:`tritonforge.bench.overload_report` judges them against the contract's targets.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing
import os
import platform
import random
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tritonforge.bench.contract import Contract, load_contract
from tritonforge.bench.metrics import percentile
from tritonforge.bench.noise import RoundWatch
from tritonforge.bench.results import RunResult
from tritonforge.bench.workload import PromptBuilder, draw_length
from tritonforge.launch.launcher import MODEL_REPOSITORY, TritonServer
from tritonforge.paths import CACHE_DIR, REPO_ROOT, make_machine_free

MODES = {"on": "on", "off": "observe"}
#: Seconds the requests of a cell may run past its last arrival before they are cancelled.
DRAIN_S = 60.0
#: Seconds between two probes of the error path in an overload cell.
PROBE_INTERVAL_S = 0.5
#: A request every model refuses in execute() before admission sees it (unknown key).
PROBE_BODY = {"text_input": "probe", "stream": True, "parameters": {"overload_probe": 1}}
#: The driver's real-time priority (SCHED_FIFO) once the server is up.
DRIVER_RT_PRIORITY = 10


@dataclass
class Outcome:
    """One request as the client saw it (seconds from its arrival)."""

    arrival: float
    measured: bool
    asked: int
    tokens: int = 0  # that arrived: the sum of each response's num_output_tokens
    ttft_s: float | None = None
    e2e_s: float | None = None
    refused: bool = False
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        """Mean seconds per token after the first, over the tokens that arrived."""
        if self.ttft_s is None or self.e2e_s is None or self.error or self.refused:
            return None
        return (self.e2e_s - self.ttft_s) / max(self.tokens - 1, 1)

    def meets(self, ttft_s: float, tpot_s: float) -> bool:
        tpot = self.tpot_s
        return (
            tpot is not None
            and self.ttft_s is not None
            and self.ttft_s <= ttft_s
            and tpot <= tpot_s
        )


def repository(model: str, into: Path) -> Path:
    """A repository with ``<model>_on`` and ``<model>_off`` (admission on / observe)."""
    for mode, setting in MODES.items():
        target = into / f"{model}_{mode}"
        shutil.copytree(MODEL_REPOSITORY / model, target)
        config = target / "config.pbtxt"
        config.write_text(
            config.read_text()
            + f'\nparameters {{ key: "admission" value: {{ string_value: "{setting}" }} }}\n'
        )
    return into


async def one(http: httpx.AsyncClient, url: str, body: dict[str, Any], outcome: Outcome) -> None:
    """Send one request at its arrival; fill ``outcome`` from its SSE stream."""
    start = time.perf_counter()
    try:
        async with http.stream("POST", url, json=body) as reply:
            if reply.status_code != 200:
                text = (await reply.aread()).decode(errors="replace")
                outcome.refused = "SLO admission refused" in text
                outcome.error = None if outcome.refused else text[:200]
                outcome.e2e_s = time.perf_counter() - start
                return
            async for line in reply.aiter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    outcome.refused = "SLO admission refused" in event["error"]
                    outcome.error = None if outcome.refused else event["error"][:200]
                    continue
                count = event.get("num_output_tokens", 0)
                outcome.tokens += sum(count) if isinstance(count, list) else int(count)
                if outcome.ttft_s is None and outcome.tokens:
                    outcome.ttft_s = time.perf_counter() - start
        outcome.e2e_s = time.perf_counter() - start
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        outcome.error = repr(exc)[:200]


def refused_by_name(reply: str) -> None:
    """Stop the run unless the probe's answer names its unknown key: a probe answered
    any other way did not take the error path it is there to time."""
    if "overload_probe" not in reply:
        raise RuntimeError(f"the probe was not refused by name: {reply[:200]}")


async def probe(http: httpx.AsyncClient, url: str, after: float, until: float) -> list[float]:
    """Milliseconds to answer a malformed request, one every PROBE_INTERVAL_S from
    ``after`` to ``until`` (perf_counter times).

    Why: a refusal is answered from execute(), after the request has crossed Triton and
    the Python stub on a host whose cores the engine fills. A malformed request takes
    the same path and is answered before admission is asked, so its time under the same
    load is the floor under a refusal's: what admission adds is the difference.
    """
    latencies = []
    while (start := time.perf_counter()) < until:
        reply = await http.post(url, json=PROBE_BODY)
        took = time.perf_counter() - start
        refused_by_name(reply.text)
        if start >= after:
            latencies.append(1000 * took)
        await asyncio.sleep(max(start + PROBE_INTERVAL_S - time.perf_counter(), 0))
    return latencies


def blocking_probe(url: str, after: float, until: float) -> list[float]:
    """:func:`probe` from a process of its own at the default priority (wall-clock window).

    Why: the driver runs real-time (:func:`driver_priority`); this process is a client
    with no priority on the server's two cores, so the two probes side by side say how
    much of a tail is the client waiting for a CPU rather than the server answering.
    """
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))  # not the driver's
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port)
    body, headers = json.dumps(PROBE_BODY), {"Content-Type": "application/json"}
    latencies = []
    while (now := time.time()) < until:
        start = time.perf_counter()
        connection.request("POST", parts.path, body, headers)
        text = connection.getresponse().read().decode(errors="replace")
        took = time.perf_counter() - start
        refused_by_name(text)
        if now >= after:
            latencies.append(1000 * took)
        time.sleep(max(now + PROBE_INTERVAL_S - time.time(), 0))
    connection.close()
    return latencies


async def loop_lateness(after: float, until: float) -> list[float]:
    """Milliseconds by which the driver's event loop overslept a 10 ms sleep in the window."""
    lateness = []
    while (start := time.perf_counter()) < until:
        await asyncio.sleep(0.01)
        if start >= after:
            lateness.append(1000 * (time.perf_counter() - start - 0.01))
    return lateness


@dataclass
class Probes:
    """What a cell's probes measured in its window (milliseconds)."""

    in_loop: list[float] = field(default_factory=list)
    own_process: list[float] = field(default_factory=list)
    loop_lateness: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float | None]:
        return {
            "malformed_p50_ms": percentile(self.in_loop, 50),
            "malformed_p99_ms": percentile(self.in_loop, 99),
            "malformed_own_process_p50_ms": percentile(self.own_process, 50),
            "malformed_own_process_p99_ms": percentile(self.own_process, 99),
            "driver_lateness_p99_ms": percentile(self.loop_lateness, 99),
        }


@dataclass
class Arrival:
    """One request of a cell's schedule: when it is sent (seconds from the cell's start)."""

    at: float
    measured: bool
    asked: int
    body: dict[str, Any]


def schedule(
    contract: Contract,
    prompts: PromptBuilder,
    rate: float,
    warmup_s: float,
    duration_s: float,
    seed: int,
) -> list[Arrival]:
    """Poisson arrivals at ``rate`` over warm-up + duration, drawn from ``seed``."""
    rng = random.Random(seed)
    cls = contract.traffic.classes[0]
    slo = {"slo_ttft_ms": contract.slo.ttft_p95_ms, "slo_tpot_ms": contract.slo.tpot_p95_ms}
    arrivals, t = [], rng.expovariate(rate)
    while t < warmup_s + duration_s:
        tokens = draw_length(cls.output_tokens, rng)
        text = prompts.text(draw_length(cls.input_tokens, rng), rng)
        parameters = {"max_tokens": tokens, "ignore_eos": True, "temperature": 0, **slo}
        body = {
            "text_input": text,
            "stream": True,  # else the model answers once, with every token at the end
            "return_num_output_tokens": True,
            "parameters": parameters,
        }
        arrivals.append(Arrival(t, t >= warmup_s, tokens, body))
        t += rng.expovariate(rate)
    return arrivals


async def send(
    url: str, arrivals: list[Arrival], window: tuple[float, float], probes: Probes | None
) -> list[Outcome]:
    """Send ``arrivals`` at their times (seconds from now) and await every one.

    Past the measured window a request still running after DRAIN_S has long missed its
    SLO: it is cancelled (the dropped stream cancels it in Triton) and counted as
    unfinished, so an overloaded cell ends in bounded time.
    """
    outcomes = [Outcome(a.at, a.measured, a.asked) for a in arrivals]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    spawn = multiprocessing.get_context("spawn")
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        with ProcessPoolExecutor(1, mp_context=spawn) as side:
            begin, wall = time.perf_counter(), time.time()
            measured = (begin + window[0], begin + window[1])
            watchers: list[asyncio.Future[list[float]]] = []
            if probes is not None:
                watchers = [
                    asyncio.create_task(probe(http, url, *measured)),
                    asyncio.get_running_loop().run_in_executor(
                        side, blocking_probe, url, wall + window[0], wall + window[1]
                    ),
                    asyncio.create_task(loop_lateness(*measured)),
                ]
            tasks = []
            for arrival, outcome in zip(arrivals, outcomes, strict=True):
                await asyncio.sleep(max(begin + arrival.at - time.perf_counter(), 0))
                tasks.append(asyncio.create_task(one(http, url, arrival.body, outcome)))
            _, pending = await asyncio.wait(tasks, timeout=DRAIN_S) if tasks else ((), ())
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            if probes is not None:
                probes.in_loop, probes.own_process, probes.loop_lateness = await asyncio.gather(
                    *watchers
                )
    return outcomes


def cell(
    server: TritonServer,
    model: str,
    arrivals: list[Arrival],
    warmup_s: float,
    duration_s: float,
    probes: Probes | None = None,
) -> list[Outcome]:
    """``arrivals`` (a :func:`schedule` over warm-up + duration) sent; every request awaited.

    With ``probes`` given, malformed requests are sent beside the arrivals from the
    driver's loop (:func:`probe`) and from a process of their own (:func:`blocking_probe`),
    and the loop's lateness is sampled: the measured window's figures fill ``probes``.
    """
    url = f"http://{server.http_url}/v2/models/{model}/generate_stream"
    outcomes = asyncio.run(send(url, arrivals, (warmup_s, warmup_s + duration_s), probes))
    for outcome in outcomes:
        if outcome.e2e_s is None and outcome.error is None and not outcome.refused:
            outcome.error = "unfinished"
    return outcomes


def summary(outcomes: list[Outcome], contract: Contract, duration_s: float) -> dict[str, Any]:
    """Goodput and the targets' other quantities over the measured requests."""
    measured = [o for o in outcomes if o.measured]
    ttft_s, tpot_s = contract.slo.ttft_p95_ms / 1000, contract.slo.tpot_p95_ms / 1000
    good = [o for o in measured if o.meets(ttft_s, tpot_s)]
    refused = [o for o in measured if o.refused]
    admitted = [o for o in measured if not o.refused]
    refusal_ms = [1000 * (o.e2e_s or 0) for o in refused]
    return {
        "offered": len(measured),
        "goodput_rps": len(good) / duration_s,
        "refused": len(refused),
        "failed": sum(1 for o in measured if o.error),
        "admitted_slo_share": len(good) / len(admitted) if admitted else None,
        "refusal_p50_ms": percentile(refusal_ms, 50),
        "refusal_p99_ms": percentile(refusal_ms, 99),
        "ttft_p50_s": percentile([o.ttft_s for o in admitted if o.ttft_s], 50),
        # which promise the admitted requests broke, and by how much
        "ttft_p95_s": percentile([o.ttft_s for o in admitted if o.ttft_s], 95),
        "tpot_p50_s": percentile([o.tpot_s for o in admitted if o.tpot_s is not None], 50),
        "tpot_p95_s": percentile([o.tpot_s for o in admitted if o.tpot_s is not None], 95),
        "missed_ttft": sum(1 for o in admitted if o.ttft_s is not None and o.ttft_s > ttft_s),
        "missed_tpot": sum(1 for o in admitted if (o.tpot_s or 0) > tpot_s),
    }


def samples(server: TritonServer, metric: str, model: str, label: str) -> dict[str, float]:
    """``metric``'s samples for ``model`` on the metrics port, keyed by ``label``'s value."""
    text = httpx.get(server.metrics_url, timeout=10).text
    return {
        sample.labels[label]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == metric and sample.labels.get("model") == model and label in sample.labels
    }


def decisions(server: TritonServer, model: str) -> dict[str, float]:
    """Admission decisions of ``model`` so far, by reason (admitted, refused_ttft, …)."""
    return samples(server, "vllm:admission_decisions_total", model, "decision")


def error_buckets(server: TritonServer, model: str) -> dict[float, float]:
    """Cumulative TTFT prediction-error histogram of ``model``: upper bound → count."""
    buckets = samples(server, "vllm:ttft_prediction_error_ratio_bucket", model, "le")
    return {float(le): count for le, count in buckets.items()}


def median_bound(before: dict[float, float], after: dict[float, float]) -> float | None:
    """Upper bound of the bucket holding the median of the samples between two scrapes."""
    deltas = {le: after.get(le, 0) - before.get(le, 0) for le in sorted(after)}
    total = deltas.get(float("inf"), 0)
    if total <= 0:
        return None
    return next(le for le, count in deltas.items() if count >= total / 2)


def swept_saturation(run: Path) -> tuple[float, float | None]:
    """(S, the sweep's peak goodput) of an earlier run's results.json.

    A ``tritonforge.bench run`` of the contract: its saturation point and the best
    median goodput among the rates it swept, by the tool's rule. An overload run: the S
    and peak it ran with, so a partial run re-measures at the same rate.
    """
    recorded = json.loads((run / "results.json").read_text())
    if "saturation_rps" in recorded:
        return recorded["saturation_rps"], recorded["sweep_peak_goodput_rps"]
    result = RunResult.model_validate(recorded)
    swept = result.saturation[0] if result.saturation else None
    if swept is None or swept.point is None:
        raise ValueError(f"{run}: the sweep found no rate that held the SLO")
    goodputs = [level.goodput_rps.median for level in swept.levels if level.goodput_rps]
    return swept.point, max(goodputs, default=None)


def overload_cells(
    server: TritonServer,
    model: str,
    contract: Contract,
    prompts: PromptBuilder,
    rate_s: float,
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    """Every multiple x mode x round; modes alternate and multiples rotate per round."""
    assert contract.overload is not None
    multiples = list(args.multiples)
    cells = []
    for round_index in range(args.rounds):
        order = multiples[round_index:] + multiples[:round_index]
        for j, multiple in enumerate(order):
            modes = ["on", "off"] if (round_index + j) % 2 == 0 else ["off", "on"]
            for mode in modes:
                name = f"{model}_{mode}"
                before, decided = error_buckets(server, name), decisions(server, name)
                probes = Probes()
                with RoundWatch() as watch:
                    arrivals = schedule(
                        contract,
                        prompts,
                        multiple * rate_s,
                        args.warmup_s,
                        args.duration_s,
                        1000 * round_index + j,
                    )
                    outcomes = cell(server, name, arrivals, args.warmup_s, args.duration_s, probes)
                assert watch.sample is not None
                after = decisions(server, name)
                result = {
                    "round": round_index,
                    "multiple": multiple,
                    "mode": mode,
                    **summary(outcomes, contract, args.duration_s),
                    # the same path's floor: a malformed request answered from execute()
                    **probes.summary(),
                    "ttft_error_p50_at_most": median_bound(before, error_buckets(server, name)),
                    # every request of the cell, warm-up and drain included
                    "decisions": {k: v - decided.get(k, 0) for k, v in after.items()},
                    "noise": watch.sample.model_dump(),
                }
                cells.append(result)
                print(json.dumps(result))
    return cells


def driver_priority() -> str:
    """Run the driver's thread real-time (SCHED_FIFO) when allowed; say which it got.

    Why: the driver stands for clients on other machines, but here it shares two cores
    with an engine that fills them. On this VM a default-priority process that sleeps
    waits for a CPU for over 100 ms at times while a real-time one waits at most a few
    (perf/results/scheduling/20261204T040541Z/README.md), so at the default priority the
    driver's own wake-ups would be counted as the server's latency. Called once the
    server runs: tritonserver, its stubs and engines keep the default policy.
    """
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(DRIVER_RT_PRIORITY))
    except PermissionError:
        return "SCHED_OTHER (no permission for SCHED_FIFO)"
    return f"SCHED_FIFO {DRIVER_RT_PRIORITY}; the own-process probe at SCHED_OTHER"


def environment() -> dict[str, Any]:
    """Versions, the CPU, and the code the server ran (refused if launched from elsewhere)."""
    import vllm

    from tritonforge.bench.environment import machine, served_code

    host = machine()
    return {
        "cpu": host.cpu_model,
        "cores": len(os.sched_getaffinity(0)),
        "isa_flags": host.isa_flags,
        "python": platform.python_version(),
        "vllm": vllm.__version__,
        "tritonserver": "2.51.0 (nvidia-pytriton 0.7.0)",
        "served_code": served_code().model_dump(),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--contract", type=Path, default=REPO_ROOT / "perf/contracts/overload.yaml")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--saturation", type=float, help="the saturation rate S (req/s)")
    source.add_argument(
        "--saturation-from",
        type=Path,
        help="S and the sweep's peak goodput from this run's directory (a `run` of the "
        "contract, or an earlier overload run)",
    )
    parser.add_argument("--multiples", help="some of the contract's multiples, e.g. 0.5,2")
    parser.add_argument("--duration-s", type=float, help="default: the contract's")
    parser.add_argument("--warmup-s", type=float, help="default: the contract's")
    parser.add_argument("--rounds", type=int, help="default: the contract's")


def resolve(args: argparse.Namespace) -> tuple[Contract, str, float | None]:
    """The contract and its digest, with the contract's values filled into ``args``; the
    sweep's peak goodput when ``--saturation-from`` names a run."""
    contract, digest = load_contract(args.contract)
    if contract.overload is None:
        raise ValueError(f"{args.contract}: the contract has no overload section")
    args.duration_s = args.duration_s or contract.overload.duration_s
    args.warmup_s = contract.overload.warmup_s if args.warmup_s is None else args.warmup_s
    args.rounds = args.rounds or contract.overload.rounds
    every = list(contract.overload.saturation_multiples)
    args.multiples = [float(m) for m in args.multiples.split(",")] if args.multiples else every
    if unknown := set(args.multiples) - set(every):
        raise ValueError(f"--multiples: {sorted(unknown)} are not among the contract's {every}")
    peak = None
    if args.saturation_from:
        args.saturation_from = args.saturation_from.resolve()
        args.saturation, peak = swept_saturation(args.saturation_from)
    return contract, digest, peak


def main(args: argparse.Namespace) -> int:
    contract, digest, peak = resolve(args)
    assert contract.overload is not None
    every = list(contract.overload.saturation_multiples)
    env = environment()  # before the run: a run of the wrong tree's code stops here
    model = contract.targets[0].model or "vllm_model"
    prompts = PromptBuilder.for_model(CACHE_DIR / "models" / contract.model)
    out = REPO_ROOT / "perf/results/overload" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out.mkdir(parents=True)
    with (
        tempfile.TemporaryDirectory() as tmp,
        TritonServer.on_free_ports(
            repository=repository(model, Path(tmp)),
            models=[f"{model}_on", f"{model}_off"],
            log_path=out / "server.log",
        ) as server,
    ):
        scheduling = driver_priority()
        cells = overload_cells(server, model, contract, prompts, args.saturation, args)
    reduced = (
        args.duration_s < contract.overload.duration_s
        or args.rounds < contract.overload.rounds
        or args.warmup_s < contract.overload.warmup_s
    )
    results = {
        "contract": str(args.contract.resolve().relative_to(REPO_ROOT)),
        "contract_sha256": digest,
        "reduced": reduced,
        "partial": sorted(args.multiples) != sorted(every),
        "saturation_from": (
            str(args.saturation_from.relative_to(REPO_ROOT)) if args.saturation_from else None
        ),
        "settings": {
            k: v
            for k, v in vars(args).items()
            if k not in ("contract", "saturation_from", "func", "command")
        },
        "environment": env,
        "driver_scheduling": scheduling,
        "saturation_rps": args.saturation,
        "sweep_peak_goodput_rps": peak,
        "cells": cells,
    }
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    make_machine_free(out)
    print(f"wrote {out / 'results.json'}")
    print(f"verdicts: python -m tritonforge.bench overload-report {out}")
    return 0
