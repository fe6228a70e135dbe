"""What a run will do, fixed before any server starts: the contract, its levels' requests.

:func:`prepare` validates the contract and writes every level's workload (and the
warm-up's) from the model's own tokenizer, so a contract that cannot run fails before
minutes go into starting servers. Each round of each target then gets the same classes
and lengths with words of its own (:meth:`RunPlan.round_load`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from rich.console import Console

from tritonforge.bench.contract import Contract, load_contract
from tritonforge.bench.workload import (
    BenchRequest,
    PromptBuilder,
    build_workload,
    write_trace,
    write_workload,
)
from tritonforge.paths import new_run_dir

WARMUP_STREAM = 10_000
WARMUP_CONCURRENCY = 4
T = TypeVar("T")


@dataclass(frozen=True)
class LevelLoad:
    """The requests of one load level, and the files the tools read them from."""

    level: float
    requests: list[BenchRequest]
    trace: Path
    workload: Path
    stream: int = 0  # the level's seeded stream: its classes and lengths


@dataclass
class RunPlan:
    contract: Contract
    contract_path: Path
    contract_sha256: str
    overrides: list[str]
    model_dir: Path
    run_dir: Path
    scratch: Path
    levels: list[LevelLoad]
    warmup: LevelLoad | None
    builder: PromptBuilder | None = None

    def round_load(self, load: LevelLoad, round_: int, target: str) -> LevelLoad:
        """The level's requests with words of their own for this round and target.

        Same classes and lengths as every other target's; other text, so a shared engine's
        prefix cache never serves one target (or round) another's prompts.
        """
        if self.builder is None:
            return load
        tag = f"level-{load.level:g}-round-{round_ + 1}-{target}"
        requests = build_workload(
            self.contract, self.builder, len(load.requests), stream=load.stream, text=tag
        )
        return LevelLoad(
            load.level,
            requests,
            write_trace(requests, self.scratch / "workload" / f"{tag}.jsonl"),
            write_workload(requests, self.scratch / "workload" / f"{tag}.json"),
            load.stream,
        )


def model_dir_for(contract: Contract) -> Path:
    from tritonforge.launch.model_store import DEFAULT_MODEL_NAME, ensure_default_model, models_dir

    if contract.model == DEFAULT_MODEL_NAME:
        return ensure_default_model(quiet=True)
    path = models_dir() / contract.model
    if not path.is_dir():
        raise FileNotFoundError(f"model {contract.model!r} not found at {path}")
    return path


def prepare(
    contract_path: Path, overrides: Sequence[str], results_root: Path, console: Console
) -> RunPlan:
    """Validate the contract and write every level's workload before any server starts."""
    contract, digest = load_contract(contract_path, list(overrides))
    model_dir = model_dir_for(contract)
    run_dir = new_run_dir(results_root / contract.name)
    scratch = results_root / contract.name / "scratch" / run_dir.name
    console.print(
        f"[bold]{contract.name}[/]: building the workload from {model_dir.name}'s tokenizer"
    )
    builder = PromptBuilder.for_model(model_dir)

    def level_load(level: float, stream: int, n: int, tag: str) -> LevelLoad:
        requests = build_workload(contract, builder, n, stream=stream)
        return LevelLoad(
            level=level,
            requests=requests,
            trace=write_trace(requests, scratch / "workload" / f"{tag}.jsonl"),
            workload=write_workload(requests, scratch / "workload" / f"{tag}.json"),
            stream=stream,
        )

    levels = [
        level_load(lv, i, contract.load.count_for(lv), f"level-{lv:g}")
        for i, lv in enumerate(contract.load.levels)
    ]
    warm = contract.load.warmup_requests
    warmup = level_load(float(WARMUP_CONCURRENCY), WARMUP_STREAM, warm, "warmup") if warm else None
    return RunPlan(
        contract,
        contract_path,
        digest,
        list(overrides),
        model_dir,
        run_dir,
        scratch,
        levels,
        warmup,
        builder,
    )


def rotated(items: Sequence[T], by: int) -> list[T]:
    """``items`` starting at position ``by`` (mod length): round r's order of the targets."""
    if not items:
        return []
    k = by % len(items)
    return [*items[k:], *items[:k]]
