"""What several bench unit tests build the same way: a recorded environment, a refusal."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tritonforge.bench.contract import Contract, ContractError, parse_contract
from tritonforge.bench.environment import Environment, Machine, ModelIdentity
from tritonforge.bench.results import RunResult, TargetResult


def environment(**versions: dict[str, str]) -> Environment:
    """An environment as a run records it, on a made-up two-core machine."""
    return Environment(
        git_commit="0" * 40,
        git_dirty=False,
        machine=Machine(cpu_model="Test CPU", cores=2, ram_gib=8, os="Linux", python="3"),
        model=ModelIdentity(name="m", path="/m", sha256="0" * 64, files=1),
        serving_versions=versions.get("serving", {}),
        bench_versions=versions.get("bench", {}),
    )


def smoke_run(
    contract: Contract, digest: str, targets: list[TargetResult], **fields: Any
) -> RunResult:
    """A finished closed-loop run of ``contract`` (the smoke contract) with ``targets``."""
    return RunResult(
        contract_name=contract.name,
        contract_path="perf/contracts/smoke.yaml",
        contract_sha256=digest,
        overrides=[],
        contract=contract.model_dump(mode="json", by_alias=True),
        started_at="start",
        finished_at="end",
        load_mode="concurrency",
        environment=environment(),
        targets=targets,
        **fields,
    )


def contract_refusal(data: dict[str, Any], mutate: Callable[[dict[str, Any]], Any]) -> str:
    """The error a contract gets once ``mutate`` changed a copy of ``data``."""
    changed = copy.deepcopy(data)
    mutate(changed)
    with pytest.raises(ContractError) as caught:
        parse_contract(changed, "test.yaml")
    return str(caught.value)
