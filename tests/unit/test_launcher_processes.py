"""launcher's process helpers: distinct free ports, and a stop that leaves no process."""

from __future__ import annotations

import subprocess
import time

from tritonforge.launcher import free_ports, session_processes, stop_session


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
