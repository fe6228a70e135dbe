"""A scenario's verdict: what had to hold, whether it did, and what was measured.

Every scenario ends the same way — its failures decide, its criteria say what was
judged, its figures what was seen — so the verdict is built in one place, and so are
the figures every request-driving scenario reports about its requests.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from tritonforge.bench.metrics import percentile
from tritonforge.bench.reliability.clients import Outcome


class Scenario(BaseModel):
    """One scenario's verdict: what had to hold, whether it did, and what was measured."""

    name: str
    passed: bool
    criteria: list[str]
    figures: dict[str, Any]
    failures: list[str] = []  # what broke a criterion (the first few instances)
    seconds: float = 0.0


def judged(
    name: str,
    criteria: list[str],
    figures: dict[str, Any],
    failures: list[str],
    started: float,
) -> Scenario:
    """The verdict of a scenario that began at ``started`` (monotonic): passed if nothing failed."""
    return Scenario(
        name=name,
        passed=not failures,
        criteria=criteria,
        figures=figures,
        failures=failures,
        seconds=round(time.monotonic() - started, 1),
    )


def outcome_figures(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Counts by end state and by model/kind, and latency percentiles of those that succeeded."""
    by_kind: dict[str, dict[str, int]] = {}
    for o in outcomes:
        entry = by_kind.setdefault(f"{o.model}/{o.kind}", {"ok": 0, "failed": 0})
        entry["ok" if o.ok else "failed"] += 1
    latencies = sorted(o.seconds for o in outcomes if o.ok)

    def pct(q: float) -> float | None:
        value = percentile(latencies, q)
        return None if value is None else round(value, 3)

    return {
        "requests": len(outcomes),
        "succeeded": sum(o.ok for o in outcomes),
        "failed": sum(not o.ok for o in outcomes),
        "hung": sum(o.hung for o in outcomes),
        "empty_texts": sum(o.ok and not o.text for o in outcomes),
        "by_model_and_kind": dict(sorted(by_kind.items())),
        "latency_s_p50": pct(50),
        "latency_s_p99": pct(99),
        "latency_s_max": round(latencies[-1], 3) if latencies else None,
    }
