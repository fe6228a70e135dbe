"""A request past ``max_inflight`` is refused at once, in the wording the OpenAI frontend
answers 503 on. Runs the real Runtime on a scripted engine; no server."""

from __future__ import annotations

import pytest

from tests import fakes
from tritonforge.openai.errors import from_triton
from tritonforge.serving.errors import EngineBusy
from tritonforge.serving.runtime import Runtime


def test_a_request_past_max_inflight_is_refused_as_busy() -> None:
    engine = fakes.ScriptedEngine(fakes.word_script(4), delay_s=0.2)
    runtime = Runtime(engine, fakes.RecordingMetrics(), fakes.RecordingLogger(), max_inflight=1)
    first = fakes.RecordingChannel()
    runtime.start()
    try:
        runtime.submit(fakes.sampling_request(True), first)
        with pytest.raises(EngineBusy) as refused:
            runtime.submit(fakes.sampling_request(True), fakes.RecordingChannel())
        assert first.done.wait(10), "the admitted request never ended"
    finally:
        runtime.stop()
    assert str(refused.value).startswith("model is busy: 1 requests in flight (max_inflight)")
    assert first.errors() == []  # the refusal left the admitted request alone
    assert from_triton(str(refused.value), "m").status == 503
