"""A dead engine ends every request exactly once and is reported; restarts are bounded.

Server-free: the real :class:`Runtime` around a test double whose engine "dies" on
cue (tests/fakes.py). The real-server counterpart (an engine process killed under load,
the model unready and back) is in tests/e2e/test_engine_restart.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest

from tests.fakes import RecordingChannel, RecordingLogger, RecordingMetrics, ScriptedEngine
from tritonforge.engines.base import EngineOutput, PreparedPrompt
from tritonforge.serving.errors import EngineUnavailable
from tritonforge.serving.restarts import RestartLedger, RestartPolicy
from tritonforge.serving.runtime import Runtime
from tritonforge.serving.sampling import SamplingParams
from tritonforge.serving.schema import parse_request

CAUSE = "the test engine's process exited"


class DyingEngine(ScriptedEngine):
    """Streams one token, then hangs until it 'dies' (like a killed engine process)."""

    def __init__(self) -> None:
        super().__init__()
        self.dead = threading.Event()
        self.aborted: list[str] = []
        self.started = threading.Event()

    def failure(self) -> str | None:
        return CAUSE if self.dead.is_set() else None

    async def generate(
        self, request_id: str, prompt: PreparedPrompt, sampling: SamplingParams
    ) -> AsyncIterator[EngineOutput]:
        yield EngineOutput(text="a", token_ids=[1])
        self.started.set()
        await asyncio.Event().wait()  # never finishes by itself

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def _request(stream: bool):
    return parse_request(
        {"text_input": np.array([b"hi"], dtype=object), "stream": np.array([stream])}
    )


@pytest.fixture
def runtime_parts():
    engine, metrics, logger = DyingEngine(), RecordingMetrics(), RecordingLogger()
    failures: list[str] = []
    runtime = Runtime(
        engine, metrics, logger, cancellation_poll_s=0.02, on_engine_failure=failures.append
    )
    runtime.start()
    yield runtime, engine, metrics, failures
    runtime.stop()


def test_requests_in_flight_end_once_with_the_cause_and_new_ones_are_refused(
    runtime_parts,
) -> None:
    runtime, engine, metrics, failures = runtime_parts
    channels = [RecordingChannel(), RecordingChannel()]
    runtime.submit(_request(stream=True), channels[0])
    runtime.submit(_request(stream=False), channels[1])
    assert engine.started.wait(5)
    engine.dead.set()
    for channel in channels:
        assert channel.done.wait(5), "a request in flight was never ended"
    metrics.wait_for(2)
    for channel in channels:
        finals = [sent for sent in channel.sent if sent[2]]
        assert len(finals) == 1  # exactly one FINAL
        (error,) = channel.errors()
        assert isinstance(error, EngineUnavailable) and CAUSE in str(error)
    assert [r.outcome for r in metrics.records] == ["failed", "failed"]
    assert len(engine.aborted) == 2  # the engine was told to drop both
    deadline = time.monotonic() + 5
    while not failures and time.monotonic() < deadline:
        time.sleep(0.01)
    assert failures == [CAUSE]  # reported once, to the edge
    with pytest.raises(EngineUnavailable, match="the engine failed"):
        runtime.submit(_request(stream=True), RecordingChannel())


def test_death_without_traffic_is_noticed_by_the_watchdog(runtime_parts) -> None:
    runtime, engine, _, failures = runtime_parts
    engine.dead.set()
    deadline = time.monotonic() + 5
    while not failures and time.monotonic() < deadline:
        time.sleep(0.01)
    assert failures == [CAUSE]
    assert runtime.failure == CAUSE


def test_policy_reads_config_parameters_and_names_a_bad_one() -> None:
    policy = RestartPolicy.from_parameters(
        {"engine_restart_max": "5", "engine_restart_backoff_s": "0.5"}
    )
    assert (policy.max_restarts, policy.backoff_s) == (5, 0.5)
    assert RestartPolicy.from_parameters({}) == RestartPolicy()
    with pytest.raises(ValueError, match="engine_restart_max: expected a number"):
        RestartPolicy.from_parameters({"engine_restart_max": "many"})
    with pytest.raises(ValueError, match="engine_restart_backoff_s: must be >= 0"):
        RestartPolicy.from_parameters({"engine_restart_backoff_s": "-1"})


def test_backoff_doubles_up_to_its_cap() -> None:
    policy = RestartPolicy(backoff_s=2, max_backoff_s=10)
    assert [policy.delay_s(n) for n in (1, 2, 3, 4)] == [2, 4, 8, 10]


def test_ledger_outlives_a_stub_and_counts_restarts_in_the_window(tmp_path) -> None:
    policy = RestartPolicy(max_restarts=2, window_s=100)
    first = RestartLedger("m", directory=tmp_path)
    assert first.total() == 0
    times = first.record(now=1000)
    assert RestartLedger.attempt(times, policy) == 1
    again = RestartLedger("m", directory=tmp_path)  # the next stub's view
    assert again.total() == 1
    assert RestartLedger.attempt(again.record(now=1050), policy) == 2
    assert RestartLedger.attempt(again.record(now=1060), policy) == 3  # > max: give up
    assert RestartLedger.attempt(again.record(now=1500), policy) == 1  # window passed
    assert RestartLedger("other", directory=tmp_path).total() == 0
