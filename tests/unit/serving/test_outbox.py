"""Streamed responses: coalesced while the sender is busy, one per token when it keeps up.

Runs the real Runtime on scripted engines; the channel plays Triton's response sender,
slow (its first send blocks until the engine is done) or fast (the engine waits for
each response before its next token), so the outcome does not depend on thread timing.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator

import numpy as np
import pytest

from tests.fakes import (
    RecordingChannel,
    RecordingLogger,
    RecordingMetrics,
    ScriptedEngine,
    serve_once,
)
from tritonforge.engines.base import EngineOutput, PreparedPrompt
from tritonforge.serving.outbox import Final, Outbox, StreamPolicy
from tritonforge.serving.runtime import Runtime
from tritonforge.serving.sampling import SamplingParams
from tritonforge.serving.schema import parse_request

# "é" and "🙂" arrive over several tokens; only the token completing a character has text.
SCRIPT = [
    EngineOutput(text="H", token_ids=[1]),
    EngineOutput(text="", token_ids=[2]),
    EngineOutput(text="é", token_ids=[3]),
    EngineOutput(text="l", token_ids=[4]),
    EngineOutput(text="", token_ids=[5]),
    EngineOutput(text="", token_ids=[6]),
    EngineOutput(text="", token_ids=[7]),
    EngineOutput(text="🙂", token_ids=[8]),
    EngineOutput(text="!", token_ids=[9], finished=True, finish_reason="stop"),
]


def _request():
    return parse_request(
        {
            "input_ids": np.array([5], dtype=np.int32),
            "stream": np.array([True]),
            "return_num_output_tokens": np.array([True]),
        }
    )


def _pieces(channel: RecordingChannel) -> list[tuple[str, list[int], int]]:
    """(text, output ids, num_output_tokens) per response; exactly one FINAL, last."""
    assert channel.errors() == []
    assert [final for _, _, final in channel.sent].count(True) == 1 and channel.sent[-1][2]
    return [
        (
            r["text_output"][0].decode("utf-8"),
            r["output_ids"].tolist(),
            int(r["num_output_tokens"][0]),
        )
        for r in channel.responses()
    ]


class SlowChannel(RecordingChannel):
    """A sender whose first response takes until ``gate`` opens (a client reading slowly)."""

    def __init__(self) -> None:
        super().__init__()
        self.sending = threading.Event()
        self.gate = threading.Event()

    def send(self, tensors, error, final) -> None:
        self.sending.set()
        assert self.gate.wait(10)
        super().send(tensors, error, final)


class ChannelPacedEngine(ScriptedEngine):
    """A scripted engine that watches the channel its responses go to, to pace itself."""

    def __init__(self, script: list[EngineOutput], channel: RecordingChannel) -> None:
        super().__init__(script)
        self.channel = channel


class GatedEngine(ChannelPacedEngine):
    """The first delta, then the rest once its response is on its way, then the gate opens."""

    channel: SlowChannel

    async def generate(
        self, request_id: str, prompt: PreparedPrompt, sampling: SamplingParams
    ) -> AsyncIterator[EngineOutput]:
        async for delta in super().generate(request_id, prompt, sampling):
            yield delta
            while not self.channel.sending.is_set():
                await asyncio.sleep(0.001)
        self.channel.gate.set()


class LockstepEngine(ChannelPacedEngine):
    """Yields a delta only after the previous one's response reached the channel."""

    async def generate(
        self, request_id: str, prompt: PreparedPrompt, sampling: SamplingParams
    ) -> AsyncIterator[EngineOutput]:
        sent = 0
        for delta in self.script:
            while len(self.channel.sent) < sent:
                await asyncio.sleep(0.001)
            yield delta
            sent += bool(delta.text)


def test_a_slow_consumer_gets_fewer_responses_with_every_token_in_order() -> None:
    channel = SlowChannel()
    serve_once(GatedEngine(SCRIPT, channel), _request(), channel)
    pieces = _pieces(channel)
    # The first token left at once; the rest waited behind it and left as one response.
    assert pieces == [("H", [1], 1), ("él🙂!", [2, 3, 4, 5, 6, 7, 8, 9], 8)]


def test_a_consumer_that_keeps_up_gets_one_token_per_response() -> None:
    script = [EngineOutput(text=c, token_ids=[i]) for i, c in enumerate("añ🙂z")]
    script[-1] = EngineOutput(text="z", token_ids=[3], finished=True, finish_reason="length")
    channel = RecordingChannel()
    serve_once(LockstepEngine(script, channel), _request(), channel)
    assert _pieces(channel) == [("a", [0], 1), ("ñ", [1], 1), ("🙂", [2], 1), ("z", [3], 1)]


class LaneEngine(ScriptedEngine):
    """Requests A, B, C (by prompt length 1, 2, 3), each step released by the test."""

    def __init__(self) -> None:
        super().__init__()
        self.b_next, self.b_put, self.c_put = (threading.Event() for _ in range(3))
        self.gate = threading.Event()  # A's sends block until it opens; then all end

    async def generate(
        self, request_id: str, prompt: PreparedPrompt, sampling: SamplingParams
    ) -> AsyncIterator[EngineOutput]:
        async def until(event: threading.Event) -> None:
            while not event.is_set():
                await asyncio.sleep(0.001)

        name = "ABC"[len(prompt.token_ids) - 1]
        yield EngineOutput(text=name, token_ids=[1])
        if name == "B":
            await until(self.b_next)
            yield EngineOutput(text=name, token_ids=[2])
            self.b_put.set()  # runs once the runtime took the delta: its job is queued
        elif name == "C":
            self.c_put.set()
        await until(self.gate)
        yield EngineOutput(text=".", token_ids=[3], finished=True, finish_reason="stop")


class OrderedChannel(RecordingChannel):
    """Notes (its name, the send's index) in an order shared by several channels."""

    def __init__(
        self, name: str, order: list[tuple[str, int]], gate: threading.Event | None = None
    ) -> None:
        super().__init__()
        self.name, self.order, self.gate = name, order, gate
        self.sending = threading.Event()

    def send(self, tensors, error, final) -> None:
        self.sending.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        self.order.append((self.name, len(self.sent)))
        super().send(tensors, error, final)


def _request_of(tokens: int):
    return parse_request({"input_ids": np.ones(tokens, dtype=np.int32), "stream": np.array([True])})


def test_a_first_response_overtakes_the_next_responses_of_running_requests() -> None:
    """One response thread, held up by A: B's second token is queued before C's first,
    yet C's first token goes out first: C's client waits for a first token, B's for more."""
    engine, order = LaneEngine(), []
    a = OrderedChannel("A", order, gate=engine.gate)
    b, c = OrderedChannel("B", order), OrderedChannel("C", order)
    runtime = Runtime(
        engine, RecordingMetrics(), RecordingLogger(), cancellation_poll_s=60, response_threads=1
    )
    runtime.start()
    try:
        runtime.submit(_request_of(2), b)
        deadline = time.monotonic() + 10
        while not b.sent and time.monotonic() < deadline:
            time.sleep(0.001)
        runtime.submit(_request_of(1), a)
        assert a.sending.wait(10)  # the only response thread is held up in A's send
        engine.b_next.set()
        assert engine.b_put.wait(10)
        runtime.submit(_request_of(3), c)
        assert engine.c_put.wait(10)
        engine.gate.set()
        for channel in (a, b, c):
            assert channel.done.wait(10)
    finally:
        runtime.stop()
    assert order.index(("C", 0)) < order.index(("B", 1))
    assert [final for _, _, final in c.sent].count(True) == 1


@pytest.mark.parametrize("coalesce", [False, True])
def test_stream_interval_sends_every_n_tokens_and_the_rest_last(coalesce: bool) -> None:
    script = [EngineOutput(text=str(i), token_ids=[i]) for i in range(10)]
    script[-1] = EngineOutput(text="9", token_ids=[9], finished=True, finish_reason="length")
    channel = RecordingChannel()
    policy = StreamPolicy(interval=3, coalesce=coalesce)
    serve_once(ScriptedEngine(script), _request(), channel, stream_policy=policy)
    pieces = _pieces(channel)
    assert "".join(text for text, _, _ in pieces) == "0123456789"
    assert [ids for _, ids, _ in pieces for ids in ids] == list(range(10))
    counts = [n for _, _, n in pieces]
    if not coalesce:
        assert counts == [3, 3, 3, 1]
    else:  # a busy sender may join more: still at least 3 a response, the last the rest
        assert all(n >= 3 for n in counts[:-1]) and sum(counts) == 10


def test_a_request_ending_in_error_keeps_the_tokens_waiting_before_it() -> None:
    outbox = Outbox(StreamPolicy())
    assert outbox.put(EngineOutput(text="a", token_ids=[1]))  # idle: a job goes now
    assert not outbox.put(EngineOutput(text="b", token_ids=[2]))  # busy: waits
    error = TimeoutError("deadline")
    assert not outbox.finish(Final(None, error, None))
    batch = outbox.take()
    assert (batch.output.text, batch.output.token_ids) == ("ab", [1, 2])
    assert batch.final is not None and batch.final.error is error
    assert not outbox.release() and not outbox.poll()  # closed: nothing more


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"stream_interval": "0"}, "parameter stream_interval: must be a whole number"),
        ({"stream_interval": "1.5"}, "parameter stream_interval: must be a whole number"),
        ({"stream_interval": "-2"}, "parameter stream_interval: must be a whole number"),
        ({"stream_coalescing": "maybe"}, "parameter stream_coalescing: must be true or false"),
        ({"response_threads": "0"}, "parameter response_threads: must be a whole number of"),
        (
            {"cancellation_check_period_ms": "0.5"},
            "parameter cancellation_check_period_ms: must be a whole number of milliseconds",
        ),
    ],
)
def test_bad_stream_parameters_fail_naming_the_key(parameters, message) -> None:
    with pytest.raises(ValueError, match=message):
        StreamPolicy.from_parameters(parameters)


def test_stream_parameters_are_read() -> None:
    assert StreamPolicy.from_parameters({}) == StreamPolicy(1, True, 2)
    parameters = {"stream_interval": "4", "stream_coalescing": "False", "response_threads": "2"}
    assert StreamPolicy.from_parameters(parameters) == StreamPolicy(4, False, 2)
    assert StreamPolicy.from_parameters({}).cancellation_poll_s(0.05) == 0.05  # the engine's
    parameters = {"cancellation_check_period_ms": "1000"}
    assert StreamPolicy.from_parameters(parameters).cancellation_poll_s(0.05) == 1.0


class SlowSender(RecordingChannel):
    def send(self, tensors, error, final) -> None:
        time.sleep(0.002)
        super().send(tensors, error, final)


def test_stopping_sends_every_response_still_queued_and_the_final() -> None:
    script = [EngineOutput(text="x", token_ids=[i]) for i in range(60)]
    script[-1] = EngineOutput(text="x", token_ids=[59], finished=True, finish_reason="length")
    channel = SlowSender()
    metrics = RecordingMetrics()
    runtime = Runtime(
        ScriptedEngine(script),
        metrics,
        RecordingLogger(),
        stream_policy=StreamPolicy(coalesce=False),
        response_threads=2,
    )
    runtime.start()
    runtime.submit(_request(), channel)
    runtime.stop()  # the engine is done at once; most responses are still queued
    assert len(channel.responses()) == 60 and channel.sent[-1][2]
