"""The serving-ceiling contract: what the serving path itself costs, engine cost removed.

``python -m tritonforge.bench ceiling --contract perf/contracts/serving-ceiling.yaml``

One tritonserver serves a repository assembled for the run from the contract's
``models`` (copies of repository models, engine settings overridden — the unpaced
synthetic engine — and ensembles re-pointed at them) plus Triton's own Python floor
(``perf/floor/bare_stream``); this project's OpenAI frontend stands in front of it.
Every target is one model over one protocol, driven by the lean asyncio clients of
:mod:`tritonforge.bench.stream_clients` as a closed loop at each concurrency level.

A contract may set up several servers (``servers``: each its own environment and
tritonserver arguments — settings a process reads at its start, such as tracing); each
target names the one it runs on, all are up for the whole run, and ``${OTLP_RECEIVER}``
in a server's environment starts an OTLP receiver for the run that counts the spans.

Per level and round the run records what arrived (tokens/s, tokens per response), the
CPU seconds each server process spent per token (tritonserver, each model's stub, the
frontend; psutil CPU times before and after the level) and the client's own, TTFT and
ITL p50/p99, and the foreign CPU share (:mod:`tritonforge.bench.noise`). Levels run in
interleaved rounds: every target at a level once per round, the targets' order rotated.
``comparisons`` bound one target's server CPU per token by a baseline's, judged round by
round (met, missed, inconclusive). Results go to ``perf/results/<name>/<UTC timestamp>/``
(``results.json``, ``report.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psutil
import requests
import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from tritonforge.bench.contract import (
    NAME_PATTERN,
    ContractError,
    ContractHead,
    RoundsLoad,
    Strict,
    apply_overrides,
)
from tritonforge.bench.environment import (
    Environment,
    capture,
    dirty_files,
    tritonserver_version,
)
from tritonforge.bench.metrics import percentile
from tritonforge.bench.noise import RoundWatch, is_noisy
from tritonforge.bench.results import judge
from tritonforge.bench.run_plan import rotated
from tritonforge.bench.stream_clients import StreamRecord, make_client
from tritonforge.launch.launcher import (
    OpenAIFrontend,
    TritonServer,
    free_port,
    stop_session,
    wait_until_ready,
)
from tritonforge.launch.model_store import models_dir
from tritonforge.paths import REPO_ROOT, make_machine_free, new_run_dir
from tritonforge.trace.receiver import COUNT_PATH, TRACES_PATH

RESULTS_ROOT = REPO_ROOT / "perf" / "results"


class ServedModel(Strict):
    """A model of the run's repository: a copy of ``source`` under ``name``."""

    name: str = Field(pattern=NAME_PATTERN)
    source: str = Field(description="model directory, relative to the repository root")
    engine_settings: dict[str, Any] = Field(
        default_factory=dict, description="merged into 1/model.json (engine models)"
    )
    replace: dict[str, str] = Field(
        default_factory=dict, description="text replaced in config.pbtxt (an ensemble's steps)"
    )


#: In a server's ``env``, the traces URL of the OTLP receiver the run starts for it.
RECEIVER_URL = "${OTLP_RECEIVER}"
DEFAULT_SERVER = "default"


class ServerSetup(Strict):
    """One tritonserver of the run (and its OpenAI frontend, if a target of it needs one).

    Every server serves the same repository; they differ only in what is set here —
    settings a process reads once, at its start (tracing), so a variant of them needs a
    server of its own. All are up for the whole run, so their targets interleave.
    """

    name: str = Field(pattern=NAME_PATTERN)
    env: dict[str, str] = Field(
        default_factory=dict,
        description="set in the environment of the server, its stubs and its frontend; "
        f"{RECEIVER_URL} in a value is the traces URL of an OTLP/HTTP receiver the run "
        "starts in a process of its own (it counts spans and drops them)",
    )
    triton_args: list[str] = Field(
        default_factory=list,
        description="more tritonserver arguments (e.g. Triton's own --trace-config)",
    )


class CeilingTarget(Strict):
    name: str = Field(pattern=NAME_PATTERN)
    model: str
    protocol: Literal["grpc", "http", "openai_chat", "openai_completions"]
    server: str = Field(default=DEFAULT_SERVER, description="the `servers` entry it runs on")
    concurrency: list[int] | None = Field(
        default=None,
        description="runs only at those of the load's levels listed here (a paced engine's "
        "high ones); None: at every level",
    )

    def runs_at(self, concurrency: int) -> bool:
        return self.concurrency is None or concurrency in self.concurrency


class CeilingLoad(RoundsLoad):
    """The contract load's shared fields (:class:`RoundsLoad`), closed loop, one prompt."""

    concurrency: list[int] = Field(min_length=1)
    warmup_requests: int = Field(default=4, ge=0)
    output_tokens: int = Field(ge=1, description="max_tokens of every request")
    prompt: str = Field(min_length=1, description="the prompt text; each request numbers it")
    request_timeout_s: float = Field(
        default=60, gt=0, description="a request still streaming after this is an error"
    )
    quiet_window_s: float = Field(default=1.0, ge=0)
    settle_s: float = Field(
        default=0.0,
        ge=0,
        description="the CPU window stays open this long after a level's last request, so "
        "work its requests leave behind (spans leaving in batches) is charged to them",
    )
    together: list[list[str]] = Field(
        default_factory=list,
        description="groups of targets measured at once, each at the level's concurrency "
        "and charged its own server's CPU: a machine whose speed drifts over minutes "
        "drifts for all of a group alike, so their ratios keep what sequential "
        "measurements lose in the drift; a group's targets need a server each",
    )


class CeilingComparison(Strict):
    """A target's server CPU per token over a baseline's, paired round by round at one
    level, judged like every comparison of the bench (:func:`results.judge`)."""

    target: str
    baseline: str
    concurrency: int = Field(ge=1)
    max_server_cpu_ratio: float = Field(
        gt=0, description="met when the ratio is at most this in every round"
    )


class CeilingContract(ContractHead):
    kind: Literal["ceiling"] = Field(
        description="marks the contract for this runner: `run` and `validate` dispatch on it"
    )
    models: list[ServedModel] = Field(min_length=1)
    servers: list[ServerSetup] = Field(
        default_factory=lambda: [ServerSetup(name=DEFAULT_SERVER)],
        min_length=1,
        description="the run's tritonservers (default: one, set up as `make serve` does)",
    )
    targets: list[CeilingTarget] = Field(min_length=1)
    baseline: str = Field(description="the target every other is compared with (the floor)")
    comparisons: list[CeilingComparison] = Field(
        default_factory=list, description="server CPU per token bounds, judged per round"
    )
    load: CeilingLoad

    @model_validator(mode="after")
    def _consistent(self) -> CeilingContract:
        served = {m.name for m in self.models}
        servers = [s.name for s in self.servers]
        if len(set(servers)) < len(servers):
            raise ValueError(f"servers: names repeat ({', '.join(servers)})")
        for target in self.targets:
            if target.model not in served:
                raise ValueError(f"target {target.name}: model {target.model!r} is not in models")
            if target.server not in servers:
                raise ValueError(
                    f"target {target.name}: server {target.server!r} is not in servers"
                )
        idle = set(servers) - {t.server for t in self.targets}
        if idle:
            raise ValueError(f"servers: {', '.join(sorted(idle))} serve no target")
        names = {t.name for t in self.targets}
        if self.baseline not in names:
            raise ValueError(f"baseline {self.baseline!r} is not a target")
        by_name = {t.name: t for t in self.targets}
        grouped: list[str] = []
        for index, group in enumerate(self.load.together):
            unknown = [name for name in group if name not in by_name]
            if unknown:
                raise ValueError(f"load.together.{index}: {', '.join(unknown)} not a target")
            hosts = [by_name[name].server for name in group]
            if len(set(hosts)) < len(hosts):
                raise ValueError(
                    f"load.together.{index}: targets share a server, so its CPU could not "
                    "be told apart"
                )
            grouped += group
        if len(set(grouped)) < len(grouped):
            raise ValueError("load.together: a target is in more than one group")
        for index, comparison in enumerate(self.comparisons):
            for side in (comparison.target, comparison.baseline):
                if side not in names:
                    raise ValueError(f"comparisons.{index}: {side!r} is not a target")
            if comparison.concurrency not in self.load.concurrency:
                raise ValueError(
                    f"comparisons.{index}: concurrency {comparison.concurrency} is not a "
                    "level of the load"
                )
        return self


def is_ceiling_contract(path: Path) -> bool:
    """Whether ``path`` declares ``kind: ceiling`` (a contract this runner reads)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError:
        return False  # the loader that reads it names the error
    return isinstance(data, dict) and data.get("kind") == "ceiling"


def load_ceiling_contract(path: Path, overrides: Sequence[str] = ()) -> CeilingContract:
    """Read and validate; ``overrides`` are ``dotted.path=yaml-value`` (``load.rounds=1``)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as error:
        raise ContractError(f"invalid contract {path}: not YAML ({error})") from None
    if not isinstance(data, dict):
        raise ContractError(f"invalid contract {path}: the top level must be a mapping")
    data = apply_overrides(data, list(overrides))
    try:
        return CeilingContract(**data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise ContractError(f"{path}: {problems}") from None


# --- the run's repository and servers -------------------------------------------------


def assemble_repository(models: Sequence[ServedModel], target: Path) -> Path:
    """Copy each model under its name, engine settings merged, config text replaced."""
    target.mkdir(parents=True, exist_ok=True)
    for model in models:
        destination = target / model.name
        shutil.copytree(REPO_ROOT / model.source, destination, symlinks=False)
        config = destination / "config.pbtxt"
        text = config.read_text()
        for old, new in model.replace.items():
            text = text.replace(old, new)
        config.write_text(text)
        if model.engine_settings:
            settings_file = destination / "1" / "model.json"
            settings = json.loads(settings_file.read_text()) | model.engine_settings
            settings_file.write_text(json.dumps(settings, indent=2))
    return target


def server_processes(server: TritonServer, frontend: OpenAIFrontend | None) -> dict[str, Any]:
    """The processes whose CPU a level is charged with, by role.

    ``tritonserver``, ``stub:<model>`` for each python-backend stub (named by the model
    directory of its ``model.py``), ``frontend`` (with its children), ``client`` (us).
    """
    assert server.process is not None
    roles: dict[str, list[psutil.Process]] = {}
    root = psutil.Process(server.process.pid)
    roles["tritonserver"] = [root]
    for child in root.children(recursive=True):
        try:
            args, name = child.cmdline(), child.name()
        except psutil.Error:
            continue
        model = next((Path(a).parent.parent.name for a in args if a.endswith("model.py")), None)
        roles.setdefault(f"stub:{model}" if model else f"other:{name}", []).append(child)
    if frontend is not None and frontend.process is not None:
        front = psutil.Process(frontend.process.pid)
        roles["frontend"] = [front, *front.children(recursive=True)]
    roles["client"] = [psutil.Process()]
    return roles


def cpu_seconds(roles: dict[str, list[psutil.Process]]) -> dict[str, float]:
    totals = {}
    for role, processes in roles.items():
        total = 0.0
        for process in processes:
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
        totals[role] = total
    return totals


# --- one level --------------------------------------------------------------------------


async def drive(
    protocol: str, url: str, model: str, load: CeilingLoad, concurrency: int, count: int
) -> list[StreamRecord]:
    """``count`` requests, ``concurrency`` at a time, each worker on its own connection."""
    client = make_client(protocol, url, model)
    await client.open()
    records: list[StreamRecord] = []
    stop_at = time.perf_counter() + load.max_duration_s
    next_index = iter(range(count))

    async def slot() -> None:
        worker = client.worker()
        try:
            for index in next_index:
                if time.perf_counter() > stop_at:
                    return
                record = StreamRecord(start=time.perf_counter())
                records.append(record)
                prompt = f"{index}. {load.prompt}"
                try:
                    sending = worker.send(prompt, load.output_tokens, record)
                    await asyncio.wait_for(sending, load.request_timeout_s)
                except Exception as exc:  # a failed request is a result, not the end
                    record.error = describe_failure(exc, record, load.request_timeout_s)
                    await close_quietly(worker)
                    worker = client.worker()
                record.end = time.perf_counter()
        finally:
            await worker.close()

    try:
        await asyncio.gather(*(slot() for _ in range(concurrency)))
    finally:
        await client.close()
    return records


def describe_failure(exc: BaseException, record: StreamRecord, timeout_s: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"no end of stream within {timeout_s:g} s ({record.tokens} tokens had arrived)"
    return f"{type(exc).__name__}: {exc}"[:300]


async def close_quietly(worker: Any) -> None:
    """Drop a slot's connection after a failure; the next request opens a new one."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(worker.close(), 5)


def summarize(records: Sequence[StreamRecord], cpu: dict[str, float]) -> dict[str, Any]:
    """One level's figures from its requests and the CPU each role spent over it."""
    ok = [r for r in records if r.error is None]
    tokens = sum(r.tokens for r in records)
    responses = sum(len(r.arrivals) for r in records)
    wall = max((r.end for r in records), default=0) - min((r.start for r in records), default=0)
    ttfts = [r.ttft * 1000 for r in ok if r.ttft is not None]
    gaps = [g * 1000 for r in ok for g in r.gaps()]
    paces = [rate for r in ok if (rate := r.decode_rate) is not None]
    per_token = {role: seconds * 1e6 / tokens for role, seconds in cpu.items()} if tokens else {}
    server = sum(v for k, v in cpu.items() if k != "client")
    return {
        "requests": len(records),
        "errors": len(records) - len(ok),
        "first_error": next((r.error for r in records if r.error), None),
        "tokens": tokens,
        "responses": responses,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "tokens_per_response": tokens / responses if responses else None,
        "cpu_s": cpu,
        "cpu_us_per_token": per_token,
        "server_cpu_us_per_token": server * 1e6 / tokens if tokens else None,
        "server_cpu_us_per_response": server * 1e6 / responses if responses else None,
        "ttft_ms": {"p50": percentile(ttfts, 50), "p99": percentile(ttfts, 99)},
        "itl_ms": {"p50": percentile(gaps, 50), "p99": percentile(gaps, 99)},
        # Each stream's tokens/s after its first response; p10 is the slower streams.
        "stream_tokens_per_s": {"p50": percentile(paces, 50), "p10": percentile(paces, 10)},
    }


class Endpoints(BaseModel):
    grpc: str
    http: str
    openai: str | None

    def url(self, protocol: str) -> str:
        if protocol.startswith("openai"):
            assert self.openai is not None, "no OpenAI frontend in this run"
            return self.openai
        return self.grpc if protocol == "grpc" else self.http


@dataclass
class Served:
    """One server of the run, up: where its targets send requests, and the processes
    whose CPU their levels are charged with."""

    endpoints: Endpoints
    roles: dict[str, list[psutil.Process]]


def measure(
    targets: Sequence[CeilingTarget],
    servers: dict[str, Served],
    load: CeilingLoad,
    concurrency: int,
    spans: Callable[[], int] | None = None,
) -> list[dict[str, Any]]:
    """One target, or a ``load.together`` group all at once, at one level: each target's
    requests and its own server's CPU deltas over the same window, and the foreign share.
    With a span receiver, the spans it took over the level and its settling: ``spans`` of
    a target measured alone, ``group_spans`` of a group (the receiver cannot tell the
    servers apart)."""
    count = load.count_for(concurrency)

    async def drive_all() -> list[list[StreamRecord]]:
        return await asyncio.gather(
            *(
                drive(
                    t.protocol,
                    servers[t.server].endpoints.url(t.protocol),
                    t.model,
                    load,
                    concurrency,
                    count,
                )
                for t in targets
            )
        )

    spans_before = spans() if spans is not None else 0
    with RoundWatch(quiet_window_s=load.quiet_window_s) as watch:
        before = [cpu_seconds(servers[t.server].roles) for t in targets]
        records = asyncio.run(drive_all())
        time.sleep(load.settle_s)
        after = [cpu_seconds(servers[t.server].roles) for t in targets]
    assert watch.sample is not None
    shared: dict[str, Any] = {
        "noise": watch.sample.model_dump(),
        "noisy": is_noisy(watch.sample.foreign_cpu_share_during, load.max_foreign_cpu_share),
    }
    if len(targets) > 1:
        shared["together"] = [t.name for t in targets]
    if spans is not None:
        shared["spans" if len(targets) == 1 else "group_spans"] = spans() - spans_before
    return [
        summarize(mine, {role: end[role] - start.get(role, 0.0) for role in end}) | shared
        for mine, start, end in zip(records, before, after, strict=True)
    ]


def measuring_units(contract: CeilingContract) -> list[list[CeilingTarget]]:
    """What a round measures, in the contract's order: each ``load.together`` group (at
    its first target's place) and every other target on its own."""
    by_name = {t.name: t for t in contract.targets}
    group_of = {name: tuple(group) for group in contract.load.together for name in group}
    units: list[list[CeilingTarget]] = []
    seen: set[tuple[str, ...]] = set()
    for target in contract.targets:
        group = group_of.get(target.name)
        if group is None:
            units.append([target])
        elif group not in seen:
            seen.add(group)
            units.append([by_name[name] for name in group])
    return units


def run_rounds(
    contract: CeilingContract,
    servers: dict[str, Served],
    spans: Callable[[], int] | None = None,
) -> list[dict[str, Any]]:
    """Every level: each round measures every target once (a ``load.together`` group at
    once), the order rotated."""
    load, rows = contract.load, []
    for target in contract.targets:  # warm-up: every path once before measuring
        if load.warmup_requests:
            url = servers[target.server].endpoints.url(target.protocol)
            asyncio.run(drive(target.protocol, url, target.model, load, 1, load.warmup_requests))
    time.sleep(load.settle_s)  # what the warm-up left behind is charged to no measurement
    for concurrency in load.concurrency:
        for round_index in range(load.rounds):
            for unit in rotated(measuring_units(contract), round_index):
                unit = [target for target in unit if target.runs_at(concurrency)]
                if not unit:
                    continue
                results = measure(unit, servers, load, concurrency, spans)
                for target, result in zip(unit, results, strict=True):
                    rows.append(
                        {
                            "target": target.name,
                            "server": target.server,
                            "concurrency": concurrency,
                            "round": round_index,
                        }
                        | result
                    )
                    print(
                        f"c={concurrency} round {round_index} {target.name}: "
                        f"{result['tokens_per_s']:.0f} tok/s, server "
                        f"{result['server_cpu_us_per_token'] or 0:.0f} µs/token, "
                        f"errors {result['errors']}",
                        flush=True,
                    )
    return rows


def verdicts(contract: CeilingContract, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each comparison's per-round ratios and verdict: met, missed or inconclusive
    (:func:`judge`); no verdict when a paired measurement was noisy."""
    out = []
    for comparison in contract.comparisons:
        at = {
            (row["target"], row["round"]): row
            for row in rows
            if row["concurrency"] == comparison.concurrency
        }
        cpu, speed, noisy = [], [], False
        for (name, round_index), row in sorted(at.items(), key=lambda item: item[0][1]):
            base = at.get((comparison.baseline, round_index))
            if name != comparison.target or base is None:
                continue
            if row["server_cpu_us_per_token"] and base["server_cpu_us_per_token"]:
                cpu.append(row["server_cpu_us_per_token"] / base["server_cpu_us_per_token"])
            if base["tokens_per_s"]:
                speed.append(row["tokens_per_s"] / base["tokens_per_s"])
            noisy = noisy or row["noisy"] or base["noisy"]
        threshold = comparison.max_server_cpu_ratio
        out.append(
            comparison.model_dump()
            | {
                "server_cpu_ratio_per_round": [round(v, 4) for v in cpu],
                "tokens_per_s_ratio_per_round": [round(v, 4) for v in speed],
                "verdict": judge(cpu, threshold, False, "noisy" if noisy else None),
            }
        )
    return out


def run_ceiling(
    contract_path: Path,
    overrides: Sequence[str] = (),
    results_root: Path = RESULTS_ROOT,
    allow_served_mismatch: bool = False,
) -> Path:
    """Run the contract; returns the results directory."""
    from tritonforge.bench.environment import served_code

    contract = load_ceiling_contract(contract_path, overrides)
    code = served_code(allow_mismatch=allow_served_mismatch)
    environment = capture(models_dir() / contract.model, code)
    uncommitted = dirty_files()  # at launch: the stubs import the tree as it is now
    run_dir = new_run_dir(results_root / contract.name)
    (run_dir / "logs").mkdir()
    with tempfile.TemporaryDirectory(prefix="tritonforge-ceiling-") as scratch:
        repository = assemble_repository(contract.models, Path(scratch) / "repository")
        rows, environment = serve_and_measure(contract, repository, run_dir, environment)
    make_machine_free(run_dir / "logs")
    write_results(run_dir, contract, overrides, environment, rows, uncommitted)
    return run_dir


def wants_receiver(servers: Sequence[ServerSetup]) -> bool:
    return any(RECEIVER_URL in value for s in servers for value in s.env.values())


def server_env(setup: ServerSetup, receiver_url: str | None) -> dict[str, str]:
    """A server's own environment, the receiver's URL put in for its placeholder."""
    if receiver_url is None and wants_receiver([setup]):
        raise ValueError(f"server {setup.name}: {RECEIVER_URL} without a receiver")
    return {
        key: value.replace(RECEIVER_URL, receiver_url or "") for key, value in setup.env.items()
    }


@contextlib.contextmanager
def span_receiver(log_path: Path) -> Iterator[tuple[str, Callable[[], int]]]:
    """An OTLP/HTTP receiver in a process of its own (:mod:`tritonforge.trace.receiver`):
    its traces URL, and a call that answers how many spans it has received."""
    port = free_port()
    command = [sys.executable, "-m", "tritonforge.trace.receiver", f"--port={port}"]
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    count_url = f"http://127.0.0.1:{port}{COUNT_PATH}"

    def spans() -> int:
        return int(requests.get(count_url, timeout=10).json()["spans"])

    try:
        wait_until_ready(process, count_url, "OTLP receiver", 60)
        yield f"http://127.0.0.1:{port}{TRACES_PATH}", spans
    finally:
        stop_session(process)


def serve_and_measure(
    contract: CeilingContract, repository: Path, run_dir: Path, environment: Environment
) -> tuple[list[dict[str, Any]], Environment]:
    """Every server of the contract up at once, its targets' rounds, every server stopped."""
    logs = run_dir / "logs"
    with contextlib.ExitStack() as stack:
        receiver_url, spans = None, None
        if wants_receiver(contract.servers):
            receiver_url, spans = stack.enter_context(span_receiver(logs / "otlp-receiver.log"))
        started = []
        for setup in contract.servers:  # side by side: each is waited for below
            prefix = "" if len(contract.servers) == 1 else f"{setup.name}-"
            server = TritonServer.on_free_ports(
                repository=repository,
                log_path=logs / f"{prefix}tritonserver.log",
                models=[m.name for m in contract.models],
                extra_args=setup.triton_args,
                env=server_env(setup, receiver_url),
            )
            stack.callback(server.stop)
            server.start()
            started.append((setup, server, prefix))
        servers: dict[str, Served] = {}
        for setup, server, prefix in started:
            servers[setup.name] = stack.enter_context(
                serving(contract, setup, server, logs / f"{prefix}openai.log")
            )
        first = started[0][1]
        environment = environment.model_copy(
            update={"tritonserver": tritonserver_version(first.http_url)}
        )
        rows = run_rounds(contract, servers, spans)
    return rows, environment


@contextlib.contextmanager
def serving(
    contract: CeilingContract, setup: ServerSetup, server: TritonServer, frontend_log: Path
) -> Iterator[Served]:
    """A started server once ready, with its OpenAI frontend when one of its targets
    needs it (stopped on the way out; the caller stops the server)."""
    server.wait_ready(timeout_s=300)
    mine = [t for t in contract.targets if t.server == setup.name]
    frontend = None
    if any(t.protocol.startswith("openai") for t in mine):
        frontend = OpenAIFrontend.on_free_port(
            server.grpc_url, log_path=frontend_log, env=server.env
        )
        frontend.start()
    try:
        if frontend is not None:
            frontend.wait_ready(timeout_s=180)  # a busy 2-core host imports slowly
        endpoints = Endpoints(
            grpc=server.grpc_url,
            http=server.http_url,
            openai=frontend.base_url.removeprefix("http://").removesuffix("/v1")
            if frontend
            else None,
        )
        yield Served(endpoints, server_processes(server, frontend))
    finally:
        if frontend is not None:
            frontend.stop()


def write_results(
    run_dir: Path,
    contract: CeilingContract,
    overrides: Sequence[str],
    environment: Environment,
    rows: list[dict[str, Any]],
    uncommitted: list[str],
) -> None:
    from tritonforge.bench.ceiling_report import render

    payload = {
        "contract": contract.model_dump(),
        "overrides": list(overrides),
        "environment": environment.model_dump(),
        "uncommitted_files_at_launch": uncommitted,
        "rows": rows,
        "verdicts": verdicts(contract, rows),
    }
    (run_dir / "results.json").write_text(json.dumps(payload, indent=2))
    (run_dir / "report.md").write_text(render(payload))
