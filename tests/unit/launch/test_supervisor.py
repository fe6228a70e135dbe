"""The launcher's supervisor against a stand-in server process that really crashes.

The stand-ins (tests/unit/launch/standins.py) are shells that die by a real signal or
exit code. The real server under the launcher is killed in
tests/e2e/test_crash_recovery.py; these cover the policy fast.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.unit.launch.standins import (
    CRASH_SEGV,
    EXIT_3,
    SERVE,
    StandIn,
    in_thread,
    supervise,
    wait_for,
)
from tritonforge.launch.launcher import free_port, session_processes
from tritonforge.launch.supervisor import (
    STUB_DIED,
    RestartPolicy,
    SupervisorMetrics,
    dead_children,
    exit_cause,
    served_models,
)


def test_exit_cause_names_the_signal_or_the_code() -> None:
    assert exit_cause(-11) == "SIGSEGV"
    assert exit_cause(-9) == "SIGKILL"
    assert exit_cause(1) == "exit code 1"


def test_backoff_doubles_up_to_its_cap_and_the_window_limits_restarts() -> None:
    policy = RestartPolicy(initial_backoff_s=1, max_backoff_s=5, max_restarts=4, window_s=100)
    assert [policy.next_delay(t) for t in (0, 1, 2, 3)] == [1, 2, 4, 5]
    assert policy.next_delay(4) is None  # a 5th restart within 100 s
    assert policy.next_delay(99) is None
    # Once the first restarts leave the window, restarts are allowed again; after a
    # quiet window the backoff starts from the beginning.
    assert policy.next_delay(100.5) == 5
    assert policy.next_delay(1000) == 1


def test_a_crashed_server_is_restarted_with_backoff_and_counted_by_cause() -> None:
    server = StandIn([CRASH_SEGV, EXIT_3, SERVE], models=["a"])
    supervisor, delays = supervise(server)
    thread, outcome = in_thread(supervisor.run)
    try:
        wait_for(lambda: len(server.starts) == 3)
        assert supervisor.exits == ["SIGSEGV", "exit code 3"]
        assert delays == [0.5, 1.0]  # doubled, capped at 1.0
        counted = supervisor.metrics.restarts
        assert counted.labels(cause="SIGSEGV")._value.get() == 1
        assert counted.labels(cause="exit code 3")._value.get() == 1
        # The crashed servers' leftover children were ended before each restart.
        assert not session_processes(server.sessions[0])
        assert not session_processes(server.sessions[1])
    finally:
        supervisor.stop()
        thread.join(10)
    assert outcome["code"] == 0  # a deliberate stop
    assert not thread.is_alive()
    assert not session_processes(server.sessions[-1])


def test_restarts_stop_at_the_windows_limit() -> None:
    server = StandIn([EXIT_3])
    supervisor, delays = supervise(server)
    assert supervisor.run() == 1  # gave up
    assert len(server.starts) == 4  # the first start and 3 restarts
    assert delays == [0.5, 1.0, 1.0]
    assert supervisor.metrics.up._value.get() == 0
    assert all(not session_processes(pid) for pid in server.sessions)


def test_a_deliberate_stop_is_not_restarted() -> None:
    server = StandIn([SERVE])
    supervisor, delays = supervise(server)
    thread, outcome = in_thread(supervisor.run)
    time.sleep(0.2)
    supervisor.stop()
    thread.join(10)
    assert not thread.is_alive() and outcome["code"] == 0
    assert len(server.starts) == 1 and delays == [] and supervisor.exits == []
    assert not session_processes(server.sessions[0])


def test_a_clean_exit_is_taken_as_a_stop() -> None:
    # tritonserver exits 0 only when it was told to stop (SIGTERM/SIGINT sent to it).
    server = StandIn(["sleep 0.1; exit 0"])
    supervisor, delays = supervise(server)
    assert supervisor.run() == 0
    assert len(server.starts) == 1 and delays == []


def test_a_restart_loads_the_models_served_at_the_crash() -> None:
    """Models loaded (and unloaded) over HTTP since the start are followed."""
    served = iter([["a"], ["a", "b"], ["b", "c"]])
    latest: list[str] = []

    def read_models(_url: str) -> list[str]:
        latest[:] = next(served, latest)
        return list(latest)

    server = StandIn(["sleep 0.4; kill -SEGV $$", SERVE], models=["a"])
    supervisor, _ = supervise(server, read_models=read_models)
    thread, _ = in_thread(supervisor.run)
    try:
        wait_for(lambda: len(server.starts) == 2)
        assert server.starts[1] == ["b", "c"]
        # What a restart would load is on the launcher's own metrics, per model.
        restored = supervisor.metrics.restored.collect()[0].samples
        assert {s.labels["model"]: s.value for s in restored} == {"b": 1, "c": 1}
    finally:
        supervisor.stop()
        thread.join(10)


def test_an_unanswered_index_keeps_the_last_known_models() -> None:
    answers = iter([["a", "b"]])
    server = StandIn(["sleep 0.3; kill -KILL $$", SERVE], models=["a"])
    supervisor, _ = supervise(server, read_models=lambda _url: next(answers, None))
    thread, _ = in_thread(supervisor.run)
    try:
        wait_for(lambda: len(server.starts) == 2)
        assert server.starts[1] == ["a", "b"]
        assert supervisor.exits == ["SIGKILL"]
    finally:
        supervisor.stop()
        thread.join(10)


def test_the_restart_counter_is_served_over_http() -> None:
    metrics = SupervisorMetrics()
    port = free_port()
    metrics.serve("127.0.0.1", port)
    try:
        metrics.restarts.labels(cause="SIGSEGV").inc()
        metrics.up.set(1)
        text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    finally:
        metrics.close()
    assert 'tritonforge_tritonserver_restarts_total{cause="SIGSEGV"} 1.0' in text
    assert "tritonforge_tritonserver_up 1.0" in text
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_the_dead_servers_shared_memory_is_removed() -> None:
    """A region the server mapped (as python backend's are) does not outlive its crash."""
    region = Path(f"/dev/shm/tritonforge_test_shm_region_{os.getpid()}")
    crash = (
        f"{sys.executable} -c \"import mmap, os, time; f = open('{region}', 'w+b'); "
        "f.truncate(4096); m = mmap.mmap(f.fileno(), 4096); time.sleep(0.5); "
        'os.kill(os.getpid(), 11)"'
    )
    server = StandIn([f"exec {crash}", SERVE])
    supervisor, _ = supervise(server)
    thread, _ = in_thread(supervisor.run)
    try:
        wait_for(lambda: len(server.starts) == 2)
        assert supervisor.exits == ["SIGSEGV"]
        assert not region.exists()
    finally:
        supervisor.stop()
        thread.join(10)
        region.unlink(missing_ok=True)


def test_a_server_that_does_not_answer_has_no_model_list() -> None:
    assert served_models(f"127.0.0.1:{free_port()}", timeout_s=0.5) is None


def test_a_child_dead_in_two_polls_restarts_the_server_as_a_dead_stub() -> None:
    """A stub Triton never reaps (a crashed one) ends the server; one sighting does not."""
    sightings = iter([set(), {41}, {42}, {42}])
    server = StandIn([SERVE, SERVE], models=["a"])
    supervisor, _delays = supervise(server, find_dead=lambda _pid: next(sightings, set()))
    thread, _outcome = in_thread(supervisor.run)
    try:
        wait_for(lambda: len(server.starts) == 2)
        assert supervisor.exits == [STUB_DIED]  # 41 was seen once, 42 twice
        assert supervisor.metrics.restarts.labels(cause=STUB_DIED)._value.get() == 1
        assert not session_processes(server.sessions[0])  # the first server was ended
    finally:
        supervisor.stop()
        thread.join(10)
    assert not thread.is_alive()


def test_dead_children_are_the_unreaped_children_of_the_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        wait_for(lambda: child.pid in dead_children(os.getpid()))
        alive = subprocess.Popen(["sleep", "30"])
        try:
            assert alive.pid not in dead_children(os.getpid())
        finally:
            alive.kill()
            alive.wait()
    finally:
        child.wait()  # reaped: no longer listed
    assert child.pid not in dead_children(os.getpid())


def test_dead_children_reads_state_and_parent_past_a_comm_with_parentheses(tmp_path: Path) -> None:
    for pid, comm, state, ppid in [
        (7, "stub (x) y", "Z", 5),
        (8, "stub", "S", 5),
        (9, "z", "Z", 6),
    ]:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} ({comm}) {state} {ppid} 1 1 0\n")
    assert dead_children(5, proc=tmp_path) == {7}
