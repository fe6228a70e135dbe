"""A response the sender refuses never costs the request its FINAL.

Every request ends exactly once with FINAL: a caller waiting for it — a client's stream,
or an ensemble that counts its step in flight until it comes — would otherwise wait until
the server's exit timeout. An error FINAL (here: the request's deadline) can share a send
job with the output that was waiting before it; when Triton refuses that output, the
FINAL must still go. Runs the real Runtime on a scripted engine; no server.
"""

from __future__ import annotations

import time

from tests.fakes import (
    RecordingChannel,
    RecordingLogger,
    ScriptedEngine,
    sampling_request,
    serve_once,
    word_script,
)
from tritonforge.serving.errors import DeadlineExceeded


class SlowThenRefusing(RecordingChannel):
    """The first response takes ``hold_s`` to go out; the second is refused."""

    def __init__(self, hold_s: float) -> None:
        super().__init__()
        self.hold_s = hold_s
        self.attempts = 0

    def send(self, tensors, error, final) -> None:
        if not final:
            self.attempts += 1
            if self.attempts == 1:
                time.sleep(self.hold_s)  # deltas pile up and the deadline passes meanwhile
            elif self.attempts == 2:
                raise RuntimeError("Unable to send response")
        super().send(tensors, error, final)


def test_the_final_goes_out_when_the_output_before_it_is_refused() -> None:
    logger = RecordingLogger()
    channel = serve_once(
        ScriptedEngine(word_script(200), delay_s=0.01),
        sampling_request(True, timeout_s=0.2),
        SlowThenRefusing(hold_s=0.6),
        logger=logger,
        cancellation_poll_s=0.01,
    )
    assert channel.attempts == 2, "the refused output and the FINAL shared no job"
    finals = [(error, final) for _, error, final in channel.sent if final]
    assert len(finals) == 1
    assert isinstance(finals[0][0], DeadlineExceeded)
    assert any("Unable to send response" in line for line in logger.errors)
