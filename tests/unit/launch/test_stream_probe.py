"""The gRPC stream probe: when it runs, when its failures restart the server, and the real
probe against in-process gRPC servers that answer, stall, or are not there."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.unit.launch.standins import (
    READY_SERVE,
    SERVE,
    StandIn,
    in_thread,
    supervise,
    wait_for,
)
from tritonforge.launch.launcher import free_port, session_processes
from tritonforge.launch.stream_probe import (
    PROBE_MODEL,
    STREAMS_STALLED,
    StreamProbe,
    stream_answers,
)


def test_the_probe_runs_once_a_period_after_the_server_became_ready() -> None:
    probe = StreamProbe(period_s=10, timeout_s=1, failures=3, check=lambda _url, _t: True)
    probe.begin(now=100)
    assert not probe.due(105)
    assert probe.due(110)
    assert probe.run("url", now=111)
    assert not probe.due(120) and probe.due(121)  # one period after the last probe


def test_only_failures_in_a_row_reach_the_threshold() -> None:
    probe = StreamProbe(failures=3)
    assert [probe.record(ok) for ok in (False, False, True, False, False)] == [False] * 5
    assert probe.record(False)  # the third in a row
    probe.begin(now=0)  # a restarted server starts from none
    assert probe.failed == 0


@pytest.mark.parametrize("settings", [{"period_s": 0}, {"failures": 0}])
def test_a_period_or_threshold_of_zero_turns_the_probe_off(settings: dict) -> None:
    probe = StreamProbe(**settings)
    probe.begin(now=0)
    assert not probe.due(1e9)


class Probes:
    """A stand-in probe answering ``answers`` in turn (its last one from then on)."""

    def __init__(self, *answers: bool) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self, _url: str, _timeout_s: float) -> bool:
        self.calls += 1
        return self.answers[min(self.calls, len(self.answers)) - 1]


def _probing(check, failures: int = 3) -> StreamProbe:
    return StreamProbe(period_s=0.01, timeout_s=1, failures=failures, check=check)


def test_streams_failing_the_threshold_restart_the_server_under_their_own_cause() -> None:
    probes = Probes(False)
    messages: list[str] = []
    server = StandIn([SERVE])
    supervisor, _ = supervise(server, streams=_probing(probes), log=messages.append)
    thread, outcome = in_thread(supervisor.run)
    try:
        wait_for(lambda: len(server.starts) == 2)
        assert supervisor.exits == [STREAMS_STALLED]
        assert supervisor.metrics.restarts.labels(cause=STREAMS_STALLED)._value.get() == 1
        assert probes.calls >= 3
        assert not session_processes(server.sessions[0])  # the stalled server was ended
        assert any("(3 of 3 in a row)" in m for m in messages), messages
    finally:
        supervisor.stop()
        thread.join(10)
    assert outcome["code"] == 0


def test_failures_not_in_a_row_restart_nothing() -> None:
    probes = Probes(False, False, True, False, False, True, False, False, True)
    server = StandIn([SERVE])
    supervisor, _ = supervise(server, streams=_probing(probes))
    thread, _ = in_thread(supervisor.run)
    try:
        wait_for(lambda: probes.calls >= 12)
        assert supervisor.exits == [] and len(server.starts) == 1
    finally:
        supervisor.stop()
        thread.join(10)


def test_the_probe_waits_for_the_server_to_be_ready(tmp_path: Path) -> None:
    probes = Probes(True)
    server = StandIn([SERVE], ready_dir=tmp_path)  # loads, never ready
    supervisor, _ = supervise(server, streams=_probing(probes))
    thread, _ = in_thread(supervisor.run)
    try:
        wait_for(lambda: server.process is not None)
        (tmp_path / "0").touch()  # now it is ready
        wait_for(lambda: probes.calls > 0)
        assert supervisor.serving.is_set()
    finally:
        supervisor.stop()
        thread.join(10)


def test_a_probe_failed_by_the_servers_death_is_not_a_stall() -> None:
    server = StandIn([SERVE, READY_SERVE])

    def dies(_url: str, _timeout_s: float) -> bool:
        server.process.kill()  # the exit, not the probe, is what ended it
        server.process.wait()
        return False

    supervisor, _ = supervise(server, streams=_probing(dies, failures=1))
    thread, _ = in_thread(supervisor.run)
    try:
        wait_for(lambda: len(server.starts) >= 2)
        assert supervisor.exits[0] == "SIGKILL"
    finally:
        supervisor.stop()
        thread.join(10)


class _Triton(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Triton's stream endpoint: answers each request, or holds it until released."""

    def __init__(self, stall: bool) -> None:
        self.stall = stall
        self.release = threading.Event()
        self.requests: list[service_pb2.ModelInferRequest] = []

    def ModelStreamInfer(self, request_iterator, context) -> Iterator:
        for request in request_iterator:
            self.requests.append(request)
            if self.stall:
                self.release.wait(30)
                return
            yield service_pb2.ModelStreamInferResponse(
                infer_response=service_pb2.ModelInferResponse(model_name=request.model_name)
            )


def _grpc_server(servicer: _Triton) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def test_a_serving_stream_answers_the_probe() -> None:
    triton = _Triton(stall=False)
    server, url = _grpc_server(triton)
    try:
        assert stream_answers(url, timeout_s=5)
        [request] = triton.requests
        assert request.model_name == PROBE_MODEL
        assert request.inputs[0].contents.bytes_contents == [b"probe"]
    finally:
        server.stop(grace=None)


def test_a_stalled_stream_fails_the_probe_within_its_timeout() -> None:
    triton = _Triton(stall=True)
    server, url = _grpc_server(triton)
    try:
        started = time.monotonic()
        assert not stream_answers(url, timeout_s=0.5)
        assert time.monotonic() - started < 5
        assert len(triton.requests) == 1  # the request got there; no answer came back
    finally:
        triton.release.set()
        server.stop(grace=None)


def test_a_server_not_listening_fails_the_probe() -> None:
    assert not stream_answers(f"127.0.0.1:{free_port()}", timeout_s=2)
