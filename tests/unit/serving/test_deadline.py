"""A request's deadline (timeout_s, or Triton's request timeout) ends it on time.

Runs the real Runtime on a slow scripted engine; no server. Each test checks what a
client relies on: the error names the limit, exactly one response is FINAL, responses
already streamed stay sent, and the engine was told to stop (its work is freed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace

import numpy as np
import pytest

from tests.fakes import (
    RecordingChannel,
    RecordingLogger,
    RecordingMetrics,
    ScriptedEngine,
    edge_module,
    sampling_request,
    word_script,
)
from tritonforge.engines.base import EngineOutput, PreparedPrompt
from tritonforge.serving.errors import DeadlineExceeded, RequestError
from tritonforge.serving.runtime import Deadline, Runtime
from tritonforge.serving.sampling import SamplingParams
from tritonforge.serving.schema import parse_request

#: 50 tokens; at 0.1 s each a request needs 5 s, far past the deadlines used here.
LONG = word_script(50)


request = sampling_request


@pytest.fixture
def serve() -> Iterator:
    """Run one request on a fresh runtime; returns (engine, channel, metrics, seconds)."""
    runtimes: list[Runtime] = []
    logger = RecordingLogger()

    def run(engine: ScriptedEngine, parsed, triton_timeout_s: float | None = None):
        metrics = RecordingMetrics()
        runtime = Runtime(engine, metrics, logger)
        runtime.start()
        runtimes.append(runtime)
        channel = RecordingChannel()
        started = time.monotonic()
        runtime.submit(parsed, channel, triton_timeout_s)
        assert channel.done.wait(10)  # the FINAL went out (its record just before it)
        metrics.wait_for(1, timeout_s=10)
        return channel, metrics, time.monotonic() - started

    yield run
    for runtime in runtimes:
        runtime.stop()
    assert logger.errors == []  # a deadline is the client's limit, not a server failure


def finals(channel: RecordingChannel) -> list[tuple]:
    return [sent for sent in channel.sent if sent[2]]


# --- the schema key ----------------------------------------------------------------


def test_timeout_s_is_a_number_of_seconds_from_either_channel() -> None:
    assert request(False, timeout_s="2.5").sampling.timeout_s == 2.5
    from_parameters = parse_request(
        {"text_input": np.array([b"hi"], dtype=np.object_)}, {"timeout_s": 3}
    )
    assert from_parameters.sampling.timeout_s == 3.0
    assert request(False).sampling.timeout_s is None  # no limit unless asked


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        (0, "must be a positive number of seconds"),
        (-1, "must be a positive number of seconds"),
        ("soon", "expected a number"),
        (True, "boolean"),
        ("inf", "finite"),
    ],
)
def test_bad_timeout_s_names_the_field(value: object, rule: str) -> None:
    with pytest.raises(RequestError) as info:
        request(False, timeout_s=value)
    assert info.value.field == "sampling_parameters.timeout_s"
    assert rule in info.value.rule


def test_the_smaller_limit_wins_and_is_named() -> None:
    assert Deadline.tightest(None, None) is None
    assert Deadline.tightest(2.0, None).source == "timeout_s"
    tighter = Deadline.tightest(2.0, 0.5)
    assert (tighter.seconds, tighter.source) == (0.5, "Triton request timeout")
    assert Deadline.tightest(0.5, 2.0).source == "timeout_s"


# --- the runtime ------------------------------------------------------------------


def test_a_streamed_request_past_its_deadline_ends_with_one_final_error(serve) -> None:
    engine = ScriptedEngine(LONG, delay_s=0.1)
    channel, metrics, seconds = serve(engine, request(True, timeout_s=0.5))
    assert seconds < 2.0
    streamed = channel.sent[:-1]
    assert streamed and all(e is None and not f for _, e, f in streamed)  # they stay sent
    ((tensors, error, final),) = finals(channel)
    assert channel.sent[-1] == (tensors, error, final) and tensors is None
    assert isinstance(error, DeadlineExceeded)
    assert str(error).startswith("deadline exceeded")
    assert "timeout_s of 0.5 s" in str(error)
    assert len(engine.aborted) == 1 and engine.closed == engine.aborted  # work freed
    assert metrics.records[0].outcome == "failed"


def test_a_non_streamed_request_past_its_deadline_gets_only_the_error(serve) -> None:
    engine = ScriptedEngine(LONG, delay_s=0.1)
    channel, _, seconds = serve(engine, request(False, timeout_s=0.3))
    assert seconds < 2.0
    assert len(channel.sent) == 1
    assert isinstance(channel.sent[0][1], DeadlineExceeded) and channel.sent[0][2]
    assert len(engine.aborted) == 1


def test_the_deadline_holds_while_the_engine_has_not_answered_at_all(serve) -> None:
    """A request queued or evaluating its prompt still ends on time: the wait is bounded."""
    engine = ScriptedEngine(LONG, delay_s=30)
    channel, _, seconds = serve(engine, request(True, timeout_s=0.2))
    assert seconds < 2.0
    assert [type(e) for _, e, _ in channel.sent] == [DeadlineExceeded]
    assert engine.closed == engine.aborted and len(engine.aborted) == 1


def test_tritons_request_timeout_applies_when_it_is_the_smaller(serve) -> None:
    engine = ScriptedEngine(LONG, delay_s=0.1)
    channel, _, seconds = serve(engine, request(True, timeout_s=30), triton_timeout_s=0.3)
    assert seconds < 2.0
    (final,) = finals(channel)
    assert "Triton request timeout of 0.3 s" in str(final[1])


def test_a_request_within_its_deadline_is_untouched(serve) -> None:
    engine = ScriptedEngine(LONG[-3:], delay_s=0.01)
    channel, metrics, _ = serve(engine, request(True, timeout_s=5), triton_timeout_s=10)
    assert channel.errors() == [] and len(finals(channel)) == 1
    assert engine.aborted == [] and metrics.records[0].outcome == "finished"


class LingeringEngine(ScriptedEngine):
    """Sends its final delta, then takes long to end its iterator."""

    async def generate(
        self, request_id: str, prompt: PreparedPrompt, sampling: SamplingParams
    ) -> AsyncIterator[EngineOutput]:
        for delta in self.script:
            yield delta
        await asyncio.sleep(5)


def test_a_deadline_after_the_final_response_sends_no_second_final(serve) -> None:
    engine = LingeringEngine(LONG[-2:])
    channel, _, _ = serve(engine, request(True, timeout_s=0.3))
    assert channel.errors() == []
    assert len(finals(channel)) == 1 and channel.sent[-1][2]


# --- the Triton edge ----------------------------------------------------------------


@pytest.fixture
def edge(monkeypatch: pytest.MonkeyPatch):
    """tritonforge.triton.model bound to a stand-in triton_python_backend_utils."""

    class TritonError:
        INTERNAL, UNAVAILABLE, INVALID_ARG, CANCELLED = range(4)

        def __init__(self, message: str, code: int) -> None:
            self.message, self.code = message, code

    yield from edge_module(monkeypatch, TritonError=TritonError)


def test_the_edge_answers_a_deadline_unavailable_with_its_message(edge) -> None:
    error = DeadlineExceeded(0.5, "timeout_s")
    mapped = edge.triton_error(error)
    assert mapped.code == edge.pb_utils.TritonError.UNAVAILABLE
    assert mapped.message == str(error)


def test_the_edge_reads_tritons_timeout_in_microseconds(edge) -> None:
    assert edge.triton_timeout_s(SimpleNamespace(timeout=lambda: 500_000)) == 0.5
    assert edge.triton_timeout_s(SimpleNamespace(timeout=lambda: 0)) is None  # 0: none
