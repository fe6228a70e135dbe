"""How busy the machine was with *other* work around each measured round.

On a shared two-core machine a comparison is only as good as the quiet it ran in. The
load average cannot tell: the engines' own spinning threads put it at 10-18 during a
benchmark (docs/ENVIRONMENT). What can tell is the CPU time that processes *not* of
this run used: system-wide busy time (``/proc/stat``) minus the CPU time of the
runner and every process it started (servers, stubs, engine cores, load tools —
children that already exited are in their parent's ``children_*`` times). Its share of
the machine's capacity over a window is the *foreign CPU share*; a run whose rounds
saw more than the contract's bound gets no verdict.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import psutil
from pydantic import BaseModel

TOP_FOREIGN = 3  # the busiest other processes named in a sample, so a reader sees who
#: The share of the machine other processes may take during a measurement before it is
#: noisy: a contract's default ``max_foreign_cpu_share``, and every probe's.
MAX_FOREIGN_CPU_SHARE = 0.10


def is_noisy(foreign_share: float, bound: float = MAX_FOREIGN_CPU_SHARE) -> bool:
    """The one noise rule of every runner, report and probe: a measurement during which
    other processes took more than ``bound`` of the machine judges nothing."""
    return foreign_share > bound


def all_quiet(foreign_shares: Iterable[float], bound: float = MAX_FOREIGN_CPU_SHARE) -> bool:
    """Whether every one of ``foreign_shares`` stayed within ``bound`` (True for none)."""
    return not any(is_noisy(share, bound) for share in foreign_shares)


class NoiseSample(BaseModel):
    """The machine before and during one measured round."""

    load_1m_before: float
    load_1m_after: float
    foreign_cpu_share_before: float  # share of all cores other processes used just before
    foreign_cpu_share_during: float  # the same over the round itself
    foreign_top: list[str] = []  # "name (pid): cpu s" of the busiest others during the round


@dataclass
class CpuSnapshot:
    """CPU seconds at one instant: the whole machine's, the run's, and each other process's."""

    at: float
    busy_s: float
    ours_s: float
    foreign: dict[int, tuple[str, float]] = field(default_factory=dict)


def _busy_seconds() -> float:
    times = psutil.cpu_times()
    idle = times.idle + getattr(times, "iowait", 0.0)
    return sum(times) - idle - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)


def snapshot(root: psutil.Process | None = None) -> CpuSnapshot:
    """Busy CPU seconds of the machine and of ``root``'s process tree (default: us)."""
    root = root or psutil.Process()
    ours = {root.pid, *(p.pid for p in _children(root))}
    ours_s = 0.0
    foreign: dict[int, tuple[str, float]] = {}
    for proc in psutil.process_iter(["name", "cpu_times"]):
        cpu = proc.info["cpu_times"]
        if cpu is None:  # gone or not readable between listing and reading
            continue
        if proc.pid in ours:
            ours_s += cpu.user + cpu.system + cpu.children_user + cpu.children_system
        else:
            foreign[proc.pid] = (proc.info["name"] or "?", cpu.user + cpu.system)
    return CpuSnapshot(time.monotonic(), _busy_seconds(), ours_s, foreign)


def _children(root: psutil.Process) -> list[psutil.Process]:
    try:
        return root.children(recursive=True)
    except psutil.Error:
        return []


def foreign_share(before: CpuSnapshot, after: CpuSnapshot, cores: int | None = None) -> float:
    """Share of the machine (0..1) that other processes used between two snapshots."""
    cores = cores or os.cpu_count() or 1
    wall = max(after.at - before.at, 1e-9)
    foreign_s = (after.busy_s - before.busy_s) - (after.ours_s - before.ours_s)
    return min(max(foreign_s / (wall * cores), 0.0), 1.0)


def busiest_foreign(before: CpuSnapshot, after: CpuSnapshot, top: int = TOP_FOREIGN) -> list[str]:
    """The other processes that used the most CPU between the snapshots, busiest first."""
    used = []
    for pid, (name, seconds) in after.foreign.items():
        start = before.foreign.get(pid, (name, 0.0))[1]
        if seconds - start > 0.05:
            used.append((seconds - start, f"{name} ({pid})"))
    used.sort(reverse=True)
    return [f"{who}: {seconds:.1f} cpu s" for seconds, who in used[:top]]


QUIET_WINDOW_S = 2.0  # foreign CPU is sampled this long before each round, too


class RoundWatch:
    """Measure the foreign CPU share for a short window before a round and over it.

    ``with RoundWatch(quiet_window_s=2) as watch: run()`` then ``watch.sample``.
    """

    def __init__(self, quiet_window_s: float = QUIET_WINDOW_S) -> None:
        self.quiet_window_s = quiet_window_s
        self.sample: NoiseSample | None = None

    def __enter__(self) -> RoundWatch:
        load_before = os.getloadavg()[0]
        first = snapshot()
        time.sleep(self.quiet_window_s)
        self._load_before = load_before
        self._start = snapshot()
        self._before_share = foreign_share(first, self._start)
        return self

    def __exit__(self, *exc: object) -> None:
        end = snapshot()
        self.sample = NoiseSample(
            load_1m_before=self._load_before,
            load_1m_after=os.getloadavg()[0],
            foreign_cpu_share_before=self._before_share,
            foreign_cpu_share_during=foreign_share(self._start, end),
            foreign_top=busiest_foreign(self._start, end),
        )
