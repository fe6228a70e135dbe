"""Run a load tool of the benchmark venv for one level, and read back what it exported.

Both drivers (aiperf, perf_analyzer) share one rule for a tool that did not deliver:
a missing binary, a time-out, a non-zero exit, an export that is missing, empty or not
the format expected all end in :class:`ToolError`, which carries the tool's exit code
and the tail of its output. The runner records that as a failed level (results.json
and report.md) and goes on with the next level; it never stops the run.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tritonforge.bench.metrics import MeasuredRequest
from tritonforge.paths import REPO_ROOT

BENCH_VENV = REPO_ROOT / ".venv-bench"
STARTUP_ALLOWANCE_S = 90.0  # a tool's own start-up (services, tokenizer) before the first request
LOG_TAIL_CHARS = 1500


class ToolError(RuntimeError):
    """The benchmark tool failed as a whole (not one request): the level has no result."""

    def __init__(self, reason: str, exit_code: int | None = None, log_tail: str = "") -> None:
        self.reason = reason
        self.exit_code = exit_code
        self.log_tail = log_tail
        super().__init__(f"{reason}; log tail:\n{log_tail}" if log_tail else reason)


def tool_binary(name: str) -> Path:
    binary = BENCH_VENV / "bin" / name
    if not binary.exists():
        raise ToolError(f"{binary} is missing: run scripts/setup_bench_venv.sh")
    return binary


@dataclass(frozen=True)
class ToolRun:
    """How one tool process ended; ``exit_code`` is None when it was killed at the time-out."""

    name: str
    exit_code: int | None
    seconds: float
    log: Path

    def failure(self, what: str) -> ToolError:
        ended = "timed out" if self.exit_code is None else f"exited with code {self.exit_code}"
        tail = self.log.read_text(errors="replace")[-LOG_TAIL_CHARS:] if self.log.is_file() else ""
        return ToolError(
            f"{self.name} {ended} after {self.seconds:.0f} s, {what}",
            self.exit_code,
            tail or "(the tool wrote no output)",
        )


def run_tool(
    name: str, cmd: Sequence[str], log: Path, timeout_s: float, cwd: Path | None = None
) -> ToolRun:
    """Run ``cmd`` with stdout and stderr into ``log``; a time-out ends it, not the run."""
    started = time.monotonic()
    with log.open("wb") as out:
        try:
            code: int | None = subprocess.run(
                list(cmd),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                timeout=timeout_s,
                cwd=cwd,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            code = None
    return ToolRun(name, code, time.monotonic() - started, log)


def run_logged(
    name: str, cmd: Sequence[str], artifacts: Path, max_duration_s: float, cwd: Path | None = None
) -> ToolRun:
    """One level's run of a load tool: its command line and log kept in ``artifacts``,
    bounded by the level's duration plus the tool's start-up."""
    (artifacts / "command.txt").write_text(" ".join(cmd) + "\n")
    return run_tool(
        name, cmd, artifacts / f"{name}.log", max_duration_s + STARTUP_ALLOWANCE_S, cwd=cwd
    )


def read_records(
    run: ToolRun, export: Path, parse: Callable[[Path], list[MeasuredRequest]]
) -> list[MeasuredRequest]:
    """The records in ``export``, or ToolError if the tool left none or left garbage.

    Records are kept whatever the exit code: a tool stopped at the time-out may still
    have exported every request it finished.
    """
    if not export.is_file():
        raise run.failure(f"no {export.name} written")
    try:
        records = parse(export)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        # JSONDecodeError is a ValueError; the others are an export of another shape.
        raise run.failure(f"{export.name} unreadable ({type(error).__name__}: {error})") from None
    if not records:
        raise run.failure(f"no request records in {export.name}")
    return records
