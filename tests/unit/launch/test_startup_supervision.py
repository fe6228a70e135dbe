"""A tritonserver that dies at any stage of the launcher's start-up is restarted by the
same rules as one that dies while serving.

The stages, as ``make serve`` goes through them (:func:`launcher._serve`): tritonserver
loading its models; ready while the OpenAI frontend comes up; both up. Each test kills the
stand-in server once the stage is observed (the stand-in says when it is ready; the
frontend stand-in is "coming up" while its ``wait_up`` runs). The real launcher's start-up
is killed in tests/e2e/test_startup_supervision.py.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.unit.launch.standins import (
    EXIT_3,
    READY_SERVE,
    SERVE,
    FrontendStandIn,
    StandIn,
    in_thread,
    supervise,
    wait_for,
)
from tritonforge.launch.launcher import _serve, session_processes
from tritonforge.launch.supervisor import RestartPolicy, Supervisor


def _kill(server: StandIn) -> int:
    assert server.process is not None
    pid = server.process.pid
    server.process.send_signal(signal.SIGKILL)
    return pid


class Announcements:
    """What ``_serve`` announced, with the server's state at that moment."""

    def __init__(self, server: StandIn, supervisor: Supervisor) -> None:
        self.server, self.supervisor = server, supervisor
        self.seen: list[tuple[int, bool]] = []

    def __call__(self) -> None:
        self.seen.append((len(self.server.starts), self.supervisor.serving.is_set()))


def _serving_in_thread(server: StandIn, supervisor: Supervisor, frontend: FrontendStandIn):
    announced = Announcements(server, supervisor)
    thread, outcome = in_thread(lambda: _serve(supervisor, frontend, announced))
    return thread, outcome, announced


def _stop(supervisor: Supervisor, thread, server: StandIn) -> None:
    supervisor.stop()
    thread.join(10)
    assert not thread.is_alive()
    assert all(not session_processes(pid) for pid in server.sessions)


def test_a_server_killed_while_loading_is_restarted_before_the_frontend_starts(
    tmp_path: Path,
) -> None:
    server = StandIn([SERVE, READY_SERVE], models=["a"], ready_dir=tmp_path)
    supervisor, delays = supervise(server)
    frontend = FrontendStandIn()
    thread, outcome, announced = _serving_in_thread(server, supervisor, frontend)
    try:
        wait_for(lambda: server.process is not None)  # started, loading: never ready
        first = _kill(server)
        wait_for(lambda: announced.seen)
        assert announced.seen == [(2, True)]  # announced once, by the restarted server
        assert supervisor.exits == ["SIGKILL"] and delays == [0.5]
        assert server.starts == [["a"], ["a"]]
        assert frontend.started == 1
        assert supervisor.metrics.restarts.labels(cause="SIGKILL")._value.get() == 1
        assert not session_processes(first)
    finally:
        _stop(supervisor, thread, server)
    assert outcome["code"] == 0


def test_a_server_killed_while_the_frontend_comes_up_is_restarted_before_the_ready_line(
    tmp_path: Path,
) -> None:
    server = StandIn([READY_SERVE], ready_dir=tmp_path)
    supervisor, delays = supervise(server)

    def crash_while_coming_up() -> None:
        assert supervisor.serving.is_set()  # the frontend starts only once Triton is ready
        _kill(server)
        wait_for(lambda: not supervisor.serving.is_set())  # its death seen meanwhile

    frontend = FrontendStandIn(on_wait_up=crash_while_coming_up)
    thread, outcome, announced = _serving_in_thread(server, supervisor, frontend)
    try:
        wait_for(lambda: announced.seen)
        assert announced.seen == [(2, True)]  # the ready line waited for the restart
        assert supervisor.exits == ["SIGKILL"] and delays == [0.5]
        assert frontend.started == 1
    finally:
        _stop(supervisor, thread, server)
    assert outcome["code"] == 0


def test_a_server_killed_once_everything_serves_is_restarted_and_the_frontend_kept(
    tmp_path: Path,
) -> None:
    server = StandIn([READY_SERVE], ready_dir=tmp_path)
    supervisor, delays = supervise(server)
    frontend = FrontendStandIn()
    thread, outcome, announced = _serving_in_thread(server, supervisor, frontend)
    try:
        wait_for(lambda: announced.seen)
        _kill(server)
        wait_for(lambda: len(server.starts) == 2 and supervisor.serving.is_set())
        assert announced.seen == [(1, True)]  # the ready line once, before the crash
        assert supervisor.exits == ["SIGKILL"] and delays == [0.5]
        assert frontend.started == 1
    finally:
        _stop(supervisor, thread, server)
    assert outcome["code"] == 0


def test_a_server_that_dies_at_every_start_ends_the_launcher_at_the_restart_limit(
    tmp_path: Path,
) -> None:
    server = StandIn([EXIT_3], ready_dir=tmp_path)
    supervisor, delays = supervise(server)
    frontend = FrontendStandIn()
    announced = Announcements(server, supervisor)
    assert _serve(supervisor, frontend, announced) == 1  # gave up
    assert len(server.starts) == 4 and delays == [0.5, 1.0, 1.0]  # 1 start + 3 restarts
    assert announced.seen == [] and frontend.started == 0 and frontend.stopped == 1
    assert all(not session_processes(pid) for pid in server.sessions)


def test_a_server_not_ready_within_its_start_timeout_is_restarted(tmp_path: Path) -> None:
    server = StandIn([SERVE, READY_SERVE], ready_dir=tmp_path)
    supervisor, _ = supervise(server, start_timeout_s=1.0)
    thread, outcome = in_thread(supervisor.run)
    try:
        wait_for(lambda: supervisor.serving.is_set())
        assert supervisor.exits == ["not ready after 1 s"]
        assert len(server.starts) == 2
        assert not session_processes(server.sessions[0])  # the hung one was killed
    finally:
        _stop(supervisor, thread, server)
    assert outcome["code"] == 0


def test_a_stop_while_loading_or_in_the_backoff_restarts_nothing(tmp_path: Path) -> None:
    server = StandIn([SERVE], ready_dir=tmp_path)
    supervisor, _ = supervise(server)
    thread, outcome = in_thread(supervisor.run)
    wait_for(lambda: server.process is not None)
    _stop(supervisor, thread, server)
    assert outcome["code"] == 0 and len(server.starts) == 1 and supervisor.exits == []

    # A stop during a 60 s backoff ends it at once (the real wait, not a recorded one).
    server = StandIn([EXIT_3], ready_dir=tmp_path / "2")
    slow = RestartPolicy(initial_backoff_s=60, max_backoff_s=60, max_restarts=3, window_s=60)
    supervisor, _ = supervise(server, policy=slow, sleep=None)
    thread, outcome = in_thread(supervisor.run)
    wait_for(lambda: supervisor.exits)  # died; now in its backoff
    stopped = time.monotonic()
    _stop(supervisor, thread, server)
    assert time.monotonic() - stopped < 10
    assert outcome["code"] == 0 and len(server.starts) == 1


def test_on_the_way_out_the_frontend_and_tritonserver_drain_at_once(tmp_path: Path) -> None:
    """The frontend is signalled before tritonserver's stop is awaited, not after its own
    stop: both refuse new work from the same moment and drain side by side."""
    server = StandIn(['touch "$READY"; sleep 0.5; exit 0'], ready_dir=tmp_path)
    calls: list[str] = []
    stop_server = server.stop

    def recorded_stop() -> int | None:
        calls.append("server stop")
        return stop_server()

    server.stop = recorded_stop  # type: ignore[method-assign]
    supervisor, _ = supervise(server)
    frontend = FrontendStandIn(calls=calls)
    announced = Announcements(server, supervisor)
    assert _serve(supervisor, frontend, announced, grace_s=1) == 0  # a deliberate exit
    assert announced.seen == [(1, True)]
    assert calls == ["frontend begin_stop", "server stop", "frontend stop"]
