"""launcher's process helpers: distinct free ports, and a stop that leaves no process."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tritonforge.launcher import (
    free_port,
    free_ports,
    session_processes,
    stop_session,
    wait_until_ready,
)


def test_free_ports_are_distinct() -> None:
    ports = free_ports(3)
    assert len(set(ports)) == 3 and all(1024 <= port < 65536 for port in ports)


def start_session(script: str) -> subprocess.Popen:
    """A shell leading its own session with a background child, like a server and its stubs."""
    process = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(session_processes(process.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(session_processes(process.pid)) >= 2
    return process


def test_stopping_the_leader_kills_what_is_left_of_its_session() -> None:
    # The leader exits on SIGTERM; its background child ignores SIGTERM and must be killed.
    process = start_session("(trap '' TERM; sleep 60) & sleep 60")
    code = stop_session(process, timeout_s=10)
    assert code is not None and not session_processes(process.pid)


def test_signal_group_reaches_every_member() -> None:
    process = start_session("sleep 60 & wait")
    stop_session(process, timeout_s=10, signal_group=True)
    assert not session_processes(process.pid)


def test_wait_until_ready_names_the_exit_and_the_timeout() -> None:
    """The one readiness poll every server wrapper uses: exit first, timeout otherwise."""
    url = f"http://127.0.0.1:{free_port()}/health"  # nothing listens there
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    dead.wait()
    with pytest.raises(RuntimeError, match="toy exited with code 3; tail"):
        wait_until_ready(dead, url, "toy", timeout_s=5, on_exit=lambda: "; tail")
    with pytest.raises(TimeoutError, match="toy not ready after 0 s"):
        wait_until_ready(None, url, "toy", timeout_s=0.3, poll_s=0.05)
