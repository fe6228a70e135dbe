"""Stand-ins for tritonserver and the OpenAI frontend, for the launcher's supervision tests.

The server stand-in is a shell leading its own session, often with a background child
that ignores SIGTERM (a server with a stub), which then dies by a real signal or exit
code: what the supervisor sees of a crashing tritonserver. It is ready once its script
has said so (``touch "$READY"``), or from its start if it is given nowhere to say it.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonforge.launch.launcher import stop_session
from tritonforge.launch.stream_probe import StreamProbe
from tritonforge.launch.supervisor import RestartPolicy, Supervisor

#: A child left behind in the session (ignores SIGTERM), then the leader's end.
CRASH_SEGV = "(trap '' TERM; sleep 60) & sleep 0.2; kill -SEGV $$"
EXIT_3 = "sleep 0.2; exit 3"
#: Runs until something ends it: serving, or still loading for a stand-in with a
#: ``ready_dir`` (it never says it is ready).
SERVE = "(trap '' TERM; sleep 60) & sleep 60"
#: Says it is ready at once, then serves until something ends it.
READY_SERVE = "touch \"$READY\"; (trap '' TERM; sleep 60) & sleep 60"


@dataclass
class StandIn:
    """A server whose n-th start runs ``scripts[n]`` (the last one for every later start).

    With ``ready_dir``, the n-th start is ready once its script created
    ``ready_dir/n`` (``$READY``); without, every start is ready at once.
    """

    scripts: Sequence[str]
    models: Sequence[str] | None = None
    ready_dir: Path | None = None
    process: subprocess.Popen | None = None
    starts: list[Sequence[str] | None] = field(default_factory=list)
    sessions: list[int] = field(default_factory=list)
    grpc_url: str = "127.0.0.1:1"

    def start(self) -> None:
        script = self.scripts[min(len(self.starts), len(self.scripts) - 1)]
        ready = self.ready_dir / str(len(self.starts)) if self.ready_dir else Path(os.devnull)
        env = os.environ | {"READY": str(ready)}
        self.process = subprocess.Popen(["sh", "-c", script], start_new_session=True, env=env)
        self.sessions.append(self.process.pid)
        self.starts.append(self.models)

    def is_ready(self) -> bool:
        if self.ready_dir is None:
            return True
        return (self.ready_dir / str(len(self.starts) - 1)).exists()

    def stop(self) -> int | None:
        return stop_session(self.process, timeout_s=5) if self.process is not None else None


@dataclass
class FrontendStandIn:
    """The OpenAI frontend as ``_serve`` sees it; ``on_wait_up`` runs while it comes up."""

    on_wait_up: Callable[[], None] = lambda: None
    started: int = 0
    stopped: int = 0
    #: "begin_stop" and "stop", in the order ``_serve`` called them (a test may share it).
    calls: list[str] = field(default_factory=list)

    def start(self) -> None:
        self.started += 1

    def wait_up(self) -> None:
        self.on_wait_up()

    def begin_stop(self) -> None:
        self.calls.append("frontend begin_stop")

    def stop(self, timeout_s: float = 15.0) -> None:
        self.calls.append("frontend stop")
        self.stopped += 1


def supervise(server: StandIn, **settings: Any) -> tuple[Supervisor, list[float]]:
    """A supervisor polling fast, its backoff recorded rather than waited (unless given a
    ``sleep``), no stream probe unless given one."""
    delays: list[float] = []
    policy = RestartPolicy(initial_backoff_s=0.5, max_backoff_s=1.0, max_restarts=3, window_s=60)
    supervisor = Supervisor(
        server,
        settings.pop("policy", policy),
        poll_s=0.05,
        ready_poll_s=0.05,
        streams=settings.pop("streams", StreamProbe(period_s=0)),
        read_models=settings.pop("read_models", lambda _url: None),
        find_dead=settings.pop("find_dead", lambda _pid: set()),
        log=settings.pop("log", lambda _message: None),
        sleep=settings.pop("sleep", delays.append),
        **settings,
    )
    return supervisor, delays


def in_thread(work: Callable[[], int]) -> tuple[threading.Thread, dict]:
    """Run ``work`` on a thread; its return value lands in the dict under ``code``."""
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.setdefault("code", work()))
    thread.start()
    return thread, outcome


def wait_for(predicate: Callable[[], object], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)
