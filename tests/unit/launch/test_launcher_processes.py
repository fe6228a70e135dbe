"""launcher's process helpers: distinct free ports, and a stop that leaves no process."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import psutil
import pytest

from tritonforge.launch.launcher import (
    PORT_FLOOR,
    ephemeral_range,
    free_port,
    free_ports,
    session_processes,
    stop_session,
    terminated_with_parent,
    wait_until_ready,
)


def test_free_ports_are_distinct() -> None:
    ports = free_ports(3)
    assert len(set(ports)) == 3 and all(1024 <= port < 65536 for port in ports)


def test_free_ports_stay_out_of_the_range_the_os_hands_out() -> None:
    # A port the OS gives to bind(0) (another process starting meanwhile) is never one
    # picked here, and a process never gets the same port twice, bound yet or not.
    low, _ = ephemeral_range()
    picked = [free_port() for _ in range(200)]
    assert len(set(picked)) == len(picked)
    assert all(PORT_FLOOR <= port < low for port in picked)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        assert sock.getsockname()[1] >= low  # what the OS picks lies above them


def test_a_port_in_use_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    import tritonforge.launch.launcher as launcher

    with socket.socket() as spare:  # a port that was free a moment ago, for the second try
        spare.bind(("127.0.0.1", 0))
        free = spare.getsockname()[1]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        choices = [taken, free]

        class Fixed:
            def randrange(self, start: int, stop: int) -> int:
                assert choices, "free_port asked for a third port"
                return choices.pop(0)

        monkeypatch.setattr(launcher.random, "SystemRandom", Fixed)
        monkeypatch.setattr(launcher, "ephemeral_range", lambda: (65000, 65535))
        monkeypatch.setattr(launcher, "PORT_FLOOR", 1024)
        assert launcher.free_port() == free  # the busy one was tried first and skipped
        assert choices == []


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


PARENT = """
import subprocess, sys, time
from tritonforge.launch.launcher import terminated_with_parent
child = subprocess.Popen(terminated_with_parent(["sleep", "60"]))
print(child.pid, flush=True)
time.sleep(60)
"""


def test_a_child_started_to_die_with_its_parent_gets_sigterm_when_the_parent_is_killed() -> None:
    """Without a preexec_fn (Popen then uses vfork, no fork handlers run in the launcher),
    the child is the command itself, and a SIGKILLed launcher still takes it along."""
    assert terminated_with_parent(["sleep", "1"])[-2:] == ["sleep", "1"]
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = psutil.Process(int(parent.stdout.readline()))
    deadline = time.monotonic() + 10
    while child.name() != "sleep":  # setpriv execs the command: the same process
        assert time.monotonic() < deadline, child.cmdline()
        time.sleep(0.01)
    parent.kill()
    parent.wait()
    child.wait(timeout=10)  # gone with its parent (psutil.TimeoutExpired otherwise)


def test_wait_until_ready_names_the_exit_and_the_timeout() -> None:
    """The one readiness poll every server wrapper uses: exit first, timeout otherwise."""
    url = f"http://127.0.0.1:{free_port()}/health"  # nothing listens there
    dead = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    dead.wait()
    with pytest.raises(RuntimeError, match="toy exited with code 3; tail"):
        wait_until_ready(dead, url, "toy", timeout_s=5, on_exit=lambda: "; tail")
    with pytest.raises(TimeoutError, match="toy not ready after 0 s"):
        wait_until_ready(None, url, "toy", timeout_s=0.3, poll_s=0.05)
