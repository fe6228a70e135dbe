"""A test session stopped with SIGTERM still tears down its session fixtures.

The session's tritonserver runs in a process session of its own, so a pytest killed
outright (SIGTERM's default) would leave it serving. tests/conftest.py turns SIGTERM into
an interrupt; this runs a throw-away session with that conftest as a plugin and stops it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from tritonforge.launch.launcher import REPO_ROOT

SESSION = """
import pathlib, time, pytest

@pytest.fixture(scope="session")
def server():
    yield
    pathlib.Path({torn!r}).write_text("stopped")

def test_long(server):
    pathlib.Path({ready!r}).write_text("running")
    time.sleep(120)
"""


def test_sigterm_ends_the_session_and_runs_its_teardown(tmp_path: Path) -> None:
    ready, torn = tmp_path / "ready", tmp_path / "torn"
    module = tmp_path / "test_session.py"
    module.write_text(SESSION.format(ready=str(ready), torn=str(torn)))
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", str(module)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert session.poll() is None, session.stdout.read().decode()
            assert time.monotonic() < deadline, "the throw-away session never started its test"
            time.sleep(0.1)
        session.send_signal(signal.SIGTERM)
        output = session.communicate(timeout=60)[0].decode()
    finally:
        if session.poll() is None:
            session.kill()
    assert torn.read_text() == "stopped", output
    assert session.returncode == 2, output  # pytest's "interrupted"
