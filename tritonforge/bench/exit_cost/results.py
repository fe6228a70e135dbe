"""The exit-cost suite's record: one file per candidate, every check with its evidence."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

#: passed: the application's expectation held; failed: the request was accepted but the
#: answer breaks the expectation (or the server erred); unsupported: refused (4xx) or the
#: endpoint is absent; not run: the suite was not given what the check needs.
Status = Literal["passed", "failed", "unsupported", "not run"]


class CheckResult(BaseModel):
    check: str
    status: Status
    summary: str
    # What an application observes, compared between candidates: two candidates whose
    # checks passed with different behaviours still cost a change to move between.
    behaviour: dict[str, Any] = {}
    evidence: dict[str, Any] = {}  # status codes, counts, finish reasons; never output text


class SuiteResult(BaseModel):
    format: Literal["tritonforge.exit-cost/1"] = "tritonforge.exit-cost/1"
    candidate: str
    targets: list[str] = []  # the contract run's target names this endpoint serves
    base_url: str
    model: str
    started_at: str
    finished_at: str
    environment: dict[str, Any] = {}
    checks: list[CheckResult]

    def check(self, name: str) -> CheckResult | None:
        return next((c for c in self.checks if c.check == name), None)

    def target_names(self) -> list[str]:
        return self.targets or [self.candidate]


def load_dir(directory: Path) -> list[SuiteResult]:
    """Every candidate's file in a run directory, by candidate name."""
    results = []
    for path in sorted(directory.glob("*.json")):
        data = json.loads(path.read_text())
        if data.get("format") == "tritonforge.exit-cost/1":
            results.append(SuiteResult.model_validate(data))
    return sorted(results, key=lambda r: r.candidate)
