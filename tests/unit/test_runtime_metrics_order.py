"""A request is counted before its FINAL response leaves the runtime.

A client that holds its answer and then reads /metrics (a canary, a dashboard check, the
e2e LoRA test) must see the request counted; the FINAL response and the metrics record
share one job on the response thread, record first. Runs the real Runtime on a scripted
engine; no server.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.fakes import RecordingChannel, RecordingLogger, RecordingMetrics, ScriptedEngine
from tritonforge.engines.base import EngineOutput
from tritonforge.runtime import Runtime
from tritonforge.schema import parse_request

SCRIPT = [EngineOutput(text=f"w{i} ", token_ids=[i]) for i in range(5)] + [
    EngineOutput(text="end", token_ids=[5], finished=True, finish_reason="length")
]


class CountingChannel(RecordingChannel):
    """Notes how many records the metrics sink held when the FINAL response was sent."""

    def __init__(self, metrics: RecordingMetrics, cancel_after: int | None = None) -> None:
        super().__init__(cancel_after)
        self.metrics = metrics
        self.counted_at_final: list[str] | None = None

    def send(self, tensors, error, final) -> None:
        if final:
            self.counted_at_final = [r.outcome for r in self.metrics.records]
        super().send(tensors, error, final)


def _request(stream: bool, **sampling: object):
    return parse_request(
        {
            "text_input": np.array([b"hi"], dtype=np.object_),
            "sampling_parameters": np.array([json.dumps(sampling).encode()], dtype=np.object_),
            "stream": np.array([stream]),
        }
    )


@pytest.mark.parametrize(
    ("stream", "sampling", "cancel_after", "outcome"),
    [
        (True, {}, None, "finished"),
        (False, {}, None, "finished"),
        (True, {}, 2, "cancelled"),
        (True, {"timeout_s": 0.05}, None, "failed"),
    ],
    ids=["streamed", "whole", "cancelled", "deadline"],
)
def test_the_record_is_there_when_the_final_response_goes_out(
    stream: bool, sampling: dict, cancel_after: int | None, outcome: str
) -> None:
    metrics = RecordingMetrics()
    runtime = Runtime(
        ScriptedEngine(SCRIPT, delay_s=0.02), metrics, RecordingLogger(), cancellation_poll_s=0.01
    )
    runtime.start()
    try:
        channel = CountingChannel(metrics, cancel_after)
        runtime.submit(_request(stream, **sampling), channel)
        assert channel.done.wait(10)
        metrics.wait_for(1)  # and never a second record for the same request
    finally:
        runtime.stop()
    assert channel.counted_at_final == [outcome]
    assert len([sent for sent in channel.sent if sent[2]]) == 1


class FailingMetrics(RecordingMetrics):
    def record(self, record) -> None:
        raise RuntimeError("metrics backend gone")


def test_a_failing_metrics_sink_never_costs_the_final_response() -> None:
    logger = RecordingLogger()
    runtime = Runtime(ScriptedEngine(SCRIPT), FailingMetrics(), logger)
    runtime.start()
    try:
        channel = RecordingChannel()
        runtime.submit(_request(False), channel)
        assert channel.done.wait(10)
    finally:
        runtime.stop()
    ((tensors, error, final),) = channel.sent
    assert final and error is None and tensors is not None
    assert any("metrics backend gone" in line for line in logger.errors)
