"""Keep tritonserver serving through a crash: restart it, with the models it had loaded.

Triton 2.51 (r24.10, the server the nvidia-pytriton wheel ships) can die under ordinary
client behaviour — upstream fixed segfaults in its cancellation paths only in later
releases (docs/features/reliability.md) — and no newer server binary installs from a
package registry. So ``make serve``'s launcher watches the server process from the
moment it starts it — while it loads its models, while the rest of the launcher comes up
and once everything serves, one set of rules for all of them (a segfault was seen 19 s
after a start) — and, when it exits without having been asked to, starts it again:

- after a bounded exponential backoff (a server that dies at once is not restarted in a
  tight loop), and at most ``max_restarts`` times per ``window_s`` (past that the
  launcher gives up and stops everything: something is wrong that a restart cannot fix);
- with the models that were loaded when it died: the server runs in explicit
  model-control mode, so models loaded or unloaded over HTTP since the start are
  followed by polling the repository index while it runs;
- each exit logged with its cause (signal name or exit code) and counted in
  ``tritonforge_tritonserver_restarts_total{cause=…}``, served by the launcher itself on
  127.0.0.1 (see :class:`SupervisorMetrics`).

Triton 2.51 workaround W16, see docs/triton-2.51-workarounds.md.

A model's stub that dies is a crash too: Triton 2.51 does not notice a python backend
stub that crashed (seen: SIGSEGV inside ``triton_python_backend_stub`` under a cancel
storm on the BLS model guarded_chat), never reaps it, and every request queued for that
model waits forever. The dead stub stays a zombie child of tritonserver, so a child seen
dead in two polls in a row makes the supervisor end the server and restart it like any
other crash (cause ``model stub died``; killed, since a SIGTERM would wait out the exit
timeout for requests that cannot end): its clients get an error instead of a hang.

A server that stops answering gRPC streams while its process lives on is ended and
restarted the same way (cause ``gRPC streams stalled``, see
:mod:`tritonforge.launch.stream_probe`), and so is one not ready ``start_timeout_s``
after its start (a hang while loading).

An exit with code 0 is a deliberate stop (tritonserver exits 0 after a SIGTERM or
SIGINT it was sent directly) and is not restarted; neither is anything after
:meth:`Supervisor.stop`, which is how the launcher's own Ctrl-C / SIGTERM ends it.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from tritonforge.launch.stream_probe import STREAMS_STALLED, StreamProbe

#: Repository index states that mean "this model is (being) served": a model still
#: LOADING when the server died was asked for, so it is asked for again.
SERVED_STATES = frozenset({"READY", "LOADING"})


class Supervised(Protocol):
    """What the supervisor needs of a server: a ``launcher.TritonServer``."""

    models: Sequence[str] | None
    process: Any

    @property
    def grpc_url(self) -> str: ...

    def start(self) -> None: ...

    def is_ready(self) -> bool:
        """Ready now? Asked once per poll; must answer within a few seconds."""
        ...

    def stop(self) -> int | None: ...


#: The cause a restart after a dead model stub is logged and counted under.
STUB_DIED = "model stub died"


def dead_children(pid: int, proc: Path = Path("/proc")) -> set[int]:
    """Children of ``pid`` that have exited and not been reaped (state ``Z``)."""
    dead = set()
    for stat in proc.glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # gone meanwhile
        # "pid (comm) state ppid …": comm may hold spaces or parentheses itself.
        state_ppid = text[text.rfind(")") + 2 :].split(maxsplit=2)
        if len(state_ppid) >= 2 and state_ppid[0] == "Z" and state_ppid[1] == str(pid):
            dead.add(int(stat.parent.name))
    return dead


def exit_cause(returncode: int) -> str:
    """``SIGSEGV`` for a death by signal (Popen's negative code), else ``exit code N``."""
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return signal.Signals(-returncode).name
        return f"signal {-returncode}"
    return f"exit code {returncode}"


@dataclass
class RestartPolicy:
    """Bounded exponential backoff and a limit of restarts per time window.

    The delay doubles from ``initial_backoff_s`` up to ``max_backoff_s`` with each
    restart inside the window and starts again from the beginning once the server has
    stayed up for ``window_s`` (the window forgets the old restarts).
    """

    initial_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    max_restarts: int = 5
    window_s: float = 600.0
    _restarts: deque[float] = field(default_factory=deque, init=False, repr=False)

    def next_delay(self, now: float) -> float | None:
        """The wait before the next restart, or None once the window's limit is reached."""
        while self._restarts and now - self._restarts[0] > self.window_s:
            self._restarts.popleft()
        if len(self._restarts) >= self.max_restarts:
            return None
        delay = min(self.max_backoff_s, self.initial_backoff_s * 2 ** len(self._restarts))
        self._restarts.append(now)
        return delay


class SupervisorMetrics:
    """The launcher's own Prometheus series, in a registry of their own.

    Triton's metrics port belongs to the process that dies, and a counter of its
    restarts must outlive it: so the launcher serves these itself (``serve``).
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.restarts = Counter(
            "tritonforge_tritonserver_restarts",
            "tritonserver restarts by the launcher, by cause: signal name, exit code, or why the "
            "launcher ended it (model stub died, gRPC streams stalled, not ready after N s)",
            ["cause"],
            registry=self.registry,
        )
        self.up = Gauge(
            "tritonforge_tritonserver_up",
            "1 while tritonserver is ready, 0 while it is down or restarting",
            registry=self.registry,
        )
        self.recovery = Gauge(
            "tritonforge_tritonserver_last_recovery_seconds",
            "seconds from the last unexpected exit to the restarted server being ready",
            registry=self.registry,
        )
        self.restored = Gauge(
            "tritonforge_restored_models",
            "1 for each model the launcher loads again if tritonserver restarts",
            ["model"],
            registry=self.registry,
        )
        self._server: Any = None

    def serve(self, host: str, port: int) -> None:
        """Serve /metrics on ``host:port`` from a daemon thread (prometheus_client's)."""
        self._server, _ = start_http_server(port, addr=host, registry=self.registry)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def served_models(grpc_url: str, timeout_s: float = 2.0) -> list[str] | None:
    """Models the server serves now (repository index: READY or LOADING); None if it
    does not answer (the last known set then stands).

    Over gRPC, like every model control of this project: a stub started while an HTTP
    connection is open inherits its socket (Triton 2.51), and this runs every poll.
    """
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    try:
        with grpcclient.InferenceServerClient(grpc_url) as client:
            index = client.get_model_repository_index(as_json=True, client_timeout=timeout_s)
    except (InferenceServerException, OSError):
        return None
    models = index.get("models", [])
    return sorted({m["name"] for m in models if m.get("state") in SERVED_STATES})


def shm_regions(pid: int) -> set[str]:
    """The python backend's shared-memory files ``pid`` maps (``/dev/shm/…_shm_region_…``).

    Server and stub share one region per model instance; a server that dies without
    finalising its models leaves the files behind (1 MiB or more each, in RAM), so the
    supervisor notes them while the server runs and removes them after its death.
    """
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:
        return set()
    paths = {line.split(maxsplit=5)[-1] for line in lines if "/dev/shm/" in line}
    return {p for p in paths if "_shm_region_" in p and p.startswith("/dev/shm/")}


def remove_files(paths: set[str]) -> int:
    """Unlink ``paths``; how many were still there."""
    removed = 0
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            Path(path).unlink()
            removed += 1
    return removed


def _log(message: str) -> None:
    print(f"tritonforge: {message}", file=sys.stderr, flush=True)


@dataclass
class Supervisor:
    """Start ``server`` and keep it serving until a deliberate stop.

    :meth:`run` does both, so a server that dies while it loads its models, or before the
    rest of the launcher is up, falls under the same restart rules as one that dies after
    hours of serving. :attr:`serving` is set while the running server is ready: the
    launcher waits on it rather than on the server itself.
    """

    server: Supervised
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    metrics: SupervisorMetrics = field(default_factory=SupervisorMetrics)
    poll_s: float = 2.0
    #: Readiness is asked this often while the server loads (a faster start-up line).
    ready_poll_s: float = 0.5
    #: A server not ready this long after its start is taken for hung and restarted.
    start_timeout_s: float = 600.0
    streams: StreamProbe = field(default_factory=StreamProbe)
    read_models: Callable[[str], list[str] | None] = served_models
    find_dead: Callable[[int], set[int]] = dead_children
    log: Callable[[str], None] = _log
    #: Waits out a restart's backoff; by default until the delay passes or :meth:`stop`.
    sleep: Callable[[float], object] | None = None
    #: Models to load at the next start: the last set seen served.
    models: list[str] | None = None
    exits: list[str] = field(default_factory=list)
    #: Shared-memory files the running server maps (removed once it has died).
    regions: set[str] = field(default_factory=set)
    serving: threading.Event = field(default_factory=threading.Event, init=False)
    _stopped: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    #: Held while the server is started or stopped: a stop from another thread never
    #: races a (re)start, so nothing is started after :meth:`stop`.
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def run(self) -> int:
        """Start the server and watch it; return 0 after a deliberate stop, 1 once the
        restart limit is reached."""
        died: float | None = None
        if not self._start(self.server.models):
            return 0
        while True:
            code = self._watch(died)
            self.serving.clear()
            self.metrics.up.set(0)
            if self._stopped.is_set() or code == 0:
                return 0
            died = time.monotonic()
            cause = code if isinstance(code, str) else exit_cause(code)
            self.exits.append(cause)
            delay = self.policy.next_delay(died)
            if delay is None:
                self.log(
                    f"tritonserver died ({cause}); {self.policy.max_restarts} restarts within "
                    f"{self.policy.window_s:.0f} s already: giving up"
                )
                return 1
            if not self._restart(cause, delay):
                return 0  # stopped on purpose while restarting

    def stop(self) -> None:
        """A deliberate stop, from any thread: no restart after this, the server stops
        (and its group)."""
        with self._lock:
            self._stopped.set()
            self.metrics.up.set(0)  # unready from the start of its drain
            self.server.stop()

    def _start(self, models: Sequence[str] | None) -> bool:
        """Start the server with ``models``; False if a deliberate stop came first."""
        with self._lock:
            if self._stopped.is_set():
                return False
            self.server.models = models
            self.server.start()
            return True

    def _watch(self, died: float | None) -> int | str:
        """Wait for the server to exit (its exit code), from its start on.

        Each poll while it loads asks whether it is ready yet; each poll reads its served
        models and looks for dead children; once ready, the stream probe runs when due.
        The server is ended here — the cause returned — once a child of it is seen dead
        twice (:data:`STUB_DIED`: a stub Triton stops on purpose is reaped at once, so
        one sighting is not enough), once its streams fail the probe's threshold
        (:data:`STREAMS_STALLED`), or if it is not ready ``start_timeout_s`` after its
        start. ``died`` is when the server this one replaces died (None at the first
        start): its recovery time is measured from there.
        """
        process = self.server.process
        started = time.monotonic()
        ready = False
        dead: set[int] = set()
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                return process.wait(timeout=self.poll_s if ready else self.ready_poll_s)
            if self._stopped.is_set():
                continue  # stop() is ending it: its exit comes next
            if not ready:
                if self.server.is_ready():
                    ready = True
                    self._ready(died)
                elif time.monotonic() - started > self.start_timeout_s:
                    return self._end(process, f"not ready after {self.start_timeout_s:.0f} s")
            self._track_models()
            seen = self.find_dead(process.pid)
            if still := seen & dead:
                pids = ", ".join(map(str, sorted(still)))
                return self._end(process, STUB_DIED, f" (pid {pids})")
            dead = seen
            if ready and self.streams.due(time.monotonic()) and self._streams_stalled(process):
                return self._end(process, STREAMS_STALLED)

    def _ready(self, died: float | None) -> None:
        self.metrics.up.set(1)
        self.streams.begin(time.monotonic())
        self.serving.set()
        if died is not None:
            self.metrics.recovery.set(time.monotonic() - died)
            self.log(
                f"tritonserver is serving again, {time.monotonic() - died:.1f} s after it died"
            )

    def _streams_stalled(self, process: Any) -> bool:
        """Run the stream probe; True once it has failed its threshold in a row. A probe
        that failed because the server exited meanwhile is not counted: the exit is."""
        answered = self.streams.run(self.server.grpc_url, time.monotonic())
        if process.poll() is not None or self._stopped.is_set():
            return False
        stalled = self.streams.record(answered)
        if not answered:
            self.log(
                f"a gRPC stream got no answer within {self.streams.timeout_s:.0f} s "
                f"({self.streams.failed} of {self.streams.failures} in a row)"
            )
        return stalled

    def _end(self, process: Any, cause: str, detail: str = "") -> str:
        """Kill a server that lives on but cannot serve, and return ``cause``."""
        self.log(f"{cause}{detail}: killing tritonserver, whose requests would never end")
        # Not SIGTERM: the server would wait its whole exit timeout for those requests.
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.wait()
        return cause

    def _track_models(self) -> None:
        seen = self.read_models(self.server.grpc_url)
        if seen is not None and self.server.process.poll() is None:
            if seen != self.models:
                self.metrics.restored.clear()
                for model in seen:
                    self.metrics.restored.labels(model=model).set(1)
            self.models = seen
        self.regions |= shm_regions(self.server.process.pid)

    def _restart(self, cause: str, delay: float) -> bool:
        """Clear the dead server's group, wait ``delay``, start it with the models it
        served; False if a deliberate stop came meanwhile. Its readiness, or another
        death, is :meth:`_watch`'s to see."""
        self.metrics.restarts.labels(cause=cause).inc()
        models = self.models if self.models is not None else self.server.models
        self.log(
            f"tritonserver died ({cause}); restart {len(self.exits)} in {delay:.1f} s "
            f"with models: {', '.join(models or []) or '(none)'}"
        )
        with self._lock:
            self.server.stop()  # its stubs and engine processes outlive it: end them first
        if removed := remove_files(self.regions):
            self.log(f"removed {removed} shared-memory region(s) the dead server left")
        self.regions = set()
        (self.sleep or self._stopped.wait)(delay)
        return self._start(models)
