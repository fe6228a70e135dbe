"""A model notices its server shutting down, ends what cannot finish, leaves no process.

Server-free: the watch against a small asyncio HTTP endpoint that answers, then closes
connections unanswered (what Triton 2.51's endpoint does after SIGTERM); the real
:class:`Runtime` around a test engine that never finishes; the reaper around real
processes. The real-server counterpart is tests/e2e/test_reliability.py's SIGTERM test.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tests.fakes import RecordingChannel, RecordingLogger, RecordingMetrics
from tests.unit.serving.test_engine_failure import DyingEngine, _request
from tritonforge.serving.errors import EngineUnavailable
from tritonforge.serving.runtime import Runtime
from tritonforge.triton.server_watch import ServerSettings, ShutdownWatch


def test_settings_come_from_the_tritonserver_command_line() -> None:
    argv = ["/x/tritonserver", "--http-port=9100", "--exit-timeout-secs", "25", "--log-info=true"]
    settings = ServerSettings.from_argv(argv)
    assert (settings.http_host, settings.http_port, settings.exit_timeout_s) == (
        "127.0.0.1",
        9100,
        25.0,
    )
    assert settings.grace_s() == 15.0
    assert ServerSettings.from_argv(["tritonserver", "--http-address=10.0.0.2"]).http_host == (
        "10.0.0.2"
    )
    defaults = ServerSettings.from_argv(["tritonserver"])
    assert (defaults.http_port, defaults.exit_timeout_s, defaults.grace_s()) == (8000, 30.0, 20.0)
    assert ServerSettings.from_argv(["tritonserver", "--allow-http=false"]).http_host is None
    assert ServerSettings.from_argv(["tritonserver", "--exit-timeout-secs=5"]).grace_s() == 0.0


class Endpoint:
    """Answers ``GET /v2/health/live`` until told to stop; then closes connections unanswered."""

    def __init__(self) -> None:
        self.answering = True

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if self.answering:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
        writer.close()


def test_the_watch_arms_on_an_answer_and_fires_when_answers_stop() -> None:
    async def scenario() -> list[bool]:
        endpoint = Endpoint()
        server = await asyncio.start_server(endpoint.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        watch = ShutdownWatch(ServerSettings("127.0.0.1", port, 30.0))
        seen = [await watch.poll()]  # answered: armed, not stopping
        endpoint.answering = False
        seen.append(await watch.poll())  # closed unanswered: stopping
        endpoint.answering = True
        seen.append(await watch.poll())  # sticky
        server.close()
        await server.wait_closed()
        return seen

    assert asyncio.run(scenario()) == [False, True, True]


def test_a_refused_port_before_the_first_answer_is_no_shutdown() -> None:
    """The endpoint opens only after the startup models loaded: not armed yet."""

    async def scenario() -> bool:
        probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = probe.sockets[0].getsockname()[1]
        probe.close()
        await probe.wait_closed()
        return await ShutdownWatch(ServerSettings("127.0.0.1", port, 30.0)).poll()

    assert asyncio.run(scenario()) is False


def test_a_connection_closed_unanswered_is_a_shutdown_even_before_the_first_answer() -> None:
    """A SIGTERM can come before the watch's first poll got an answer; a server still
    starting refuses connections, only a stopping one accepts and closes them."""

    async def scenario() -> tuple[bool, bool]:
        endpoint = Endpoint()
        endpoint.answering = False
        server = await asyncio.start_server(endpoint.handle, "127.0.0.1", 0)
        watch = ShutdownWatch(ServerSettings("127.0.0.1", server.sockets[0].getsockname()[1], 5))
        stopping = await watch.poll()
        server.close()
        await server.wait_closed()
        return stopping, watch.armed

    assert asyncio.run(scenario()) == (True, False)


class StoppingWatch(ShutdownWatch):
    """The server is shutting down from the first poll on (grace from its exit timeout)."""

    async def poll(self) -> bool:
        self.stopping = True
        return True


@pytest.mark.parametrize("exit_timeout_s", [10.0, 10.5])
def test_requests_in_flight_end_once_after_the_grace_and_new_ones_are_refused(
    exit_timeout_s: float,
) -> None:
    engine, metrics, logger = DyingEngine(), RecordingMetrics(), RecordingLogger()
    failures: list[str] = []
    watch = StoppingWatch(ServerSettings(None, 0, exit_timeout_s))
    runtime = Runtime(
        engine,
        metrics,
        logger,
        cancellation_poll_s=0.02,
        on_engine_failure=failures.append,
        shutdown_watch=watch,
        shutdown_poll_s=0.05,
    )
    runtime.start()
    try:
        channels = [RecordingChannel(), RecordingChannel()]
        runtime.submit(_request(stream=True), channels[0])
        runtime.submit(_request(stream=False), channels[1])
        assert engine.started.wait(5)
        started = time.monotonic()
        for channel in channels:
            assert channel.done.wait(5), "a request in flight was never ended"
        waited = time.monotonic() - started
        assert waited >= watch.settings.grace_s() - 0.1
        for channel in channels:
            finals = [final for _, _, final in channel.sent if final]
            assert finals == [True]
            (error,) = channel.errors()
            assert isinstance(error, EngineUnavailable)
            assert "shutting down" in str(error)
        with pytest.raises(EngineUnavailable):
            runtime.submit(_request(stream=True), RecordingChannel())
        assert failures == []  # a server going away is not an engine to restart
    finally:
        runtime.stop()


CHILDREN = textwrap.dedent(
    """
    import subprocess, sys, time
    from tritonforge.triton.reaper import start_reaper
    start_reaper()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    print(child.pid, flush=True)
    time.sleep(120)
    """
)


def _gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("killed", ["stub", "server"])
def test_the_reaper_ends_the_engine_processes_when_the_stub_or_its_server_dies(
    killed: str,
) -> None:
    """server (sleeps) → stub (starts the reaper and an 'engine' child) ; kill one."""
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            f"p = subprocess.Popen([sys.executable, '-c', {CHILDREN!r}], stdout=sys.stdout)\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(120)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        stub = int(server.stdout.readline())
        engine = int(server.stdout.readline())
        time.sleep(1.5)  # the reaper notes the stub's children once a second
        victim = stub if killed == "stub" else server.pid
        psutil.Process(victim).kill()
        if killed == "server":
            server.wait()
        assert _gone(engine, 10), "the engine process outlived its stub"
        if killed == "server":
            assert _gone(stub, 10), "the stub outlived its server"
    finally:
        with contextlib.suppress(psutil.Error):
            for proc in psutil.Process(server.pid).children(recursive=True):
                proc.kill()
        server.kill()
        server.wait()
