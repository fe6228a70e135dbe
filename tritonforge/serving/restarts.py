"""How a model whose engine died comes back, and how often it may.

A dead engine must not leave its model READY (a load balancer would keep routing to
it), and it must come back without an operator. Triton 2.51 gives a Python model one
way to do both through model control (explicit mode): the model unloads itself —
Triton reports it not ready at once and calls ``finalize`` once every request in
flight has had its final response — and ``finalize`` loads it again, which starts a
new stub with a new engine (LOADING, still not ready, until the engine is up).

The new stub remembers nothing, so each restart is written down in a small ledger
shared by the stubs of one server (a JSON file per model under a directory named for
the tritonserver process): it bounds restarts within a window, spaces them out with
exponential backoff, and lets the new stub's ``engine_restarts_total`` counter carry
on from the old one's.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

_Number = TypeVar("_Number", int, float)


def _non_negative(
    parameters: dict[str, str], key: str, kind: Callable[[str], _Number]
) -> _Number | None:
    """Parameter ``key`` as a number >= 0, or None when it is not set."""
    raw = parameters.get(key, "").strip()
    if not raw:
        return None
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(f"parameter {key}: expected a number, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"parameter {key}: must be >= 0, got {raw!r}")
    return value


@dataclass(frozen=True)
class RestartPolicy:
    """``engine_restart_max`` / ``engine_restart_backoff_s`` from the model's config."""

    max_restarts: int = 3  # within ``window_s``; 0 turns restarts off
    backoff_s: float = 2.0  # before the first restart; doubled for each further one
    window_s: float = 600.0
    max_backoff_s: float = 60.0

    @classmethod
    def from_parameters(cls, parameters: dict[str, str]) -> RestartPolicy:
        """Read the config.pbtxt parameters; a bad value fails the load, naming the key."""
        default = cls()
        max_restarts = _non_negative(parameters, "engine_restart_max", int)
        backoff_s = _non_negative(parameters, "engine_restart_backoff_s", float)
        return cls(
            max_restarts=default.max_restarts if max_restarts is None else max_restarts,
            backoff_s=default.backoff_s if backoff_s is None else backoff_s,
        )

    def delay_s(self, attempt: int) -> float:
        """Wait before restart number ``attempt`` (1-based) within the window."""
        return min(self.max_backoff_s, self.backoff_s * 2.0 ** (attempt - 1))


class RestartLedger:
    """Restart times of one model, kept across its stubs for the server's lifetime."""

    def __init__(self, model: str, directory: Path | None = None) -> None:
        # Stubs are children of tritonserver: its pid scopes the ledger to one server.
        base = directory or Path(tempfile.gettempdir()) / f"tritonforge-{os.getppid()}"
        self._path = base / "restarts" / f"{model}.json"

    def _times(self) -> list[float]:
        try:
            return [float(t) for t in json.loads(self._path.read_text())]
        except (OSError, ValueError, TypeError):
            return []

    def total(self) -> int:
        """Restarts of this model so far in this server's life."""
        return len(self._times())

    def record(self, now: float | None = None) -> list[float]:
        """Write one restart down; returns every restart time, this one last."""
        times = [*self._times(), time.time() if now is None else now]
        self._path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        scratch = self._path.with_suffix(".tmp")
        scratch.write_text(json.dumps(times))
        scratch.replace(self._path)
        return times

    @staticmethod
    def attempt(times: list[float], policy: RestartPolicy) -> int:
        """Which restart within the policy's window the last of ``times`` is (1-based)."""
        if not times:
            return 0
        since = times[-1] - policy.window_s
        return sum(1 for t in times if t > since)
