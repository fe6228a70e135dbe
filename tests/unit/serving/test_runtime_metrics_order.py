"""A request is counted before its FINAL response leaves the runtime.

A client that holds its answer and then reads /metrics (a canary, a dashboard check, the
e2e LoRA test) must see the request counted; the FINAL response and the metrics record
share one job on the response thread, record first. Runs the real Runtime on a scripted
engine; no server.
"""

from __future__ import annotations

import pytest

from tests.fakes import (
    RecordingChannel,
    RecordingLogger,
    RecordingMetrics,
    ScriptedEngine,
    sampling_request,
    serve_once,
    word_script,
)

SCRIPT = word_script(6)


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
    channel = serve_once(
        ScriptedEngine(SCRIPT, delay_s=0.02),
        sampling_request(stream, **sampling),
        CountingChannel(metrics, cancel_after),
        metrics,
        cancellation_poll_s=0.01,
    )
    metrics.wait_for(1)  # and never a second record for the same request
    assert channel.counted_at_final == [outcome]
    assert len([sent for sent in channel.sent if sent[2]]) == 1


class FailingMetrics(RecordingMetrics):
    def record(self, record) -> None:
        raise RuntimeError("metrics backend gone")


def test_a_failing_metrics_sink_never_costs_the_final_response() -> None:
    logger = RecordingLogger()
    channel = serve_once(
        ScriptedEngine(SCRIPT),
        sampling_request(False),
        RecordingChannel(),
        FailingMetrics(),
        logger,
    )
    ((tensors, error, final),) = channel.sent
    assert final and error is None and tensors is not None
    assert any("metrics backend gone" in line for line in logger.errors)
