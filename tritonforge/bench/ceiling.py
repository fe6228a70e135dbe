"""The serving-ceiling contract: what the serving path itself costs, engine cost removed.

``python -m tritonforge.bench ceiling --contract perf/contracts/serving-ceiling.yaml``

One tritonserver serves a repository assembled for the run from the contract's
``models`` (copies of repository models, engine settings overridden — the unpaced
synthetic engine — and ensembles re-pointed at them) plus Triton's own Python floor
(``perf/floor/bare_stream``); this project's OpenAI frontend stands in front of it.
Every target is one model over one protocol, driven by the lean asyncio clients of
:mod:`tritonforge.bench.stream_clients` as a closed loop at each concurrency level.

Per level and round the run records what arrived (tokens/s, tokens per response), the
CPU seconds each server process spent per token (tritonserver, each model's stub, the
frontend; psutil CPU times before and after the level) and the client's own, TTFT and
ITL p50/p99, and the foreign CPU share (:mod:`tritonforge.bench.noise`). Levels run in
interleaved rounds: every target at a level once per round, the targets' order rotated.
Results go to ``perf/results/<name>/<UTC timestamp>/`` (``results.json``, ``report.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import psutil
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
from tritonforge.bench.run_plan import rotated
from tritonforge.bench.stream_clients import StreamRecord, make_client
from tritonforge.launch.launcher import OpenAIFrontend, TritonServer
from tritonforge.launch.model_store import models_dir
from tritonforge.paths import REPO_ROOT, make_machine_free, new_run_dir

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


class CeilingTarget(Strict):
    name: str = Field(pattern=NAME_PATTERN)
    model: str
    protocol: Literal["grpc", "http", "openai_chat", "openai_completions"]
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


class CeilingContract(ContractHead):
    kind: Literal["ceiling"] = Field(
        description="marks the contract for this runner: `run` and `validate` dispatch on it"
    )
    models: list[ServedModel] = Field(min_length=1)
    targets: list[CeilingTarget] = Field(min_length=1)
    baseline: str = Field(description="the target every other is compared with (the floor)")
    load: CeilingLoad

    @model_validator(mode="after")
    def _consistent(self) -> CeilingContract:
        served = {m.name for m in self.models}
        for target in self.targets:
            if target.model not in served:
                raise ValueError(f"target {target.name}: model {target.model!r} is not in models")
        if self.baseline not in {t.name for t in self.targets}:
            raise ValueError(f"baseline {self.baseline!r} is not a target")
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


def measure(
    target: CeilingTarget,
    endpoints: Endpoints,
    roles: dict[str, list[psutil.Process]],
    load: CeilingLoad,
    concurrency: int,
) -> dict[str, Any]:
    """One target at one level: the requests, the CPU deltas and the foreign share."""
    count = load.count_for(concurrency)
    url = endpoints.url(target.protocol)
    with RoundWatch(quiet_window_s=load.quiet_window_s) as watch:
        before = cpu_seconds(roles)
        records = asyncio.run(drive(target.protocol, url, target.model, load, concurrency, count))
        after = cpu_seconds(roles)
    cpu = {role: after[role] - before.get(role, 0.0) for role in after}
    result = summarize(records, cpu)
    assert watch.sample is not None
    result["noise"] = watch.sample.model_dump()
    result["noisy"] = is_noisy(watch.sample.foreign_cpu_share_during, load.max_foreign_cpu_share)
    return result


# --- the run ---------------------------------------------------------------------------


def run_rounds(
    contract: CeilingContract, endpoints: Endpoints, roles: dict[str, list[psutil.Process]]
) -> list[dict[str, Any]]:
    """Every level: each round runs every target once, the targets' order rotated."""
    load, rows = contract.load, []
    for target in contract.targets:  # warm-up: every path once before measuring
        if load.warmup_requests:
            url = endpoints.url(target.protocol)
            asyncio.run(drive(target.protocol, url, target.model, load, 1, load.warmup_requests))
    for concurrency in load.concurrency:
        for round_index in range(load.rounds):
            for target in rotated(contract.targets, round_index):
                if not target.runs_at(concurrency):
                    continue
                result = measure(target, endpoints, roles, load, concurrency)
                rows.append(
                    {"target": target.name, "concurrency": concurrency, "round": round_index}
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


def serve_and_measure(
    contract: CeilingContract, repository: Path, run_dir: Path, environment: Environment
) -> tuple[list[dict[str, Any]], Environment]:
    server = TritonServer.on_free_ports(
        repository=repository,
        log_path=run_dir / "logs" / "tritonserver.log",
        models=[m.name for m in contract.models],
    )
    wants_openai = any(t.protocol.startswith("openai") for t in contract.targets)
    frontend = None
    server.start()
    try:
        server.wait_ready(timeout_s=300)
        environment = environment.model_copy(
            update={"tritonserver": tritonserver_version(server.http_url)}
        )
        if wants_openai:
            frontend = OpenAIFrontend.on_free_port(
                server.grpc_url, log_path=run_dir / "logs" / "openai.log"
            )
            frontend.start()
            frontend.wait_ready(timeout_s=180)  # a busy 2-core host imports slowly
        endpoints = Endpoints(
            grpc=server.grpc_url,
            http=server.http_url,
            openai=frontend.base_url.removeprefix("http://").removesuffix("/v1")
            if frontend
            else None,
        )
        rows = run_rounds(contract, endpoints, server_processes(server, frontend))
    finally:
        if frontend is not None:
            frontend.stop()
        server.stop()
    return rows, environment


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
    }
    (run_dir / "results.json").write_text(json.dumps(payload, indent=2))
    (run_dir / "report.md").write_text(render(payload))
