"""The runtime's streamed responses carry output_ids only with the text they complete.

This is what lets the ensemble's stateless postprocessing step decode exact text:
for byte-level BPE, decoding each response's ids alone gives its text_output.
Runs the real Runtime on a scripted engine; no server.
"""

from __future__ import annotations

import numpy as np

from tests.fakes import RecordingChannel, RecordingLogger, ScriptedEngine, serve_once
from tritonforge.engines.base import EngineOutput
from tritonforge.serving.outbox import StreamPolicy
from tritonforge.serving.schema import parse_request

# "é" split over two tokens: the first adds no text, the second completes it.
SCRIPT = [
    EngineOutput(text=" caf", token_ids=[10]),
    EngineOutput(text="", token_ids=[11]),
    EngineOutput(text="é", token_ids=[12]),
    EngineOutput(text="", token_ids=[2], finished=True, finish_reason="stop"),
]


def _run(inputs: dict[str, np.ndarray]) -> list[dict]:
    logger = RecordingLogger()
    # Coalescing off: each delta that completes text is one response, whatever the
    # threads' timing (coalesced responses stay aligned too: tests/unit/serving/test_outbox.py).
    channel = serve_once(
        ScriptedEngine(SCRIPT),
        parse_request(inputs),
        RecordingChannel(),
        None,
        logger,
        stream_policy=StreamPolicy(coalesce=False),
    )
    assert channel.errors() == [] and logger.errors == []
    return channel.responses()


def test_ids_wait_for_the_text_they_complete() -> None:
    inputs = {"input_ids": np.array([5, 6], dtype=np.int32), "stream": np.array([True])}
    responses = _run(inputs)
    pairs = [(r["text_output"][0].decode(), r["output_ids"].tolist()) for r in responses]
    assert pairs == [(" caf", [10]), ("é", [11, 12]), ("", [2])]


def test_input_ids_requests_get_output_ids_unless_they_opt_out() -> None:
    inputs = {"input_ids": np.array([5], dtype=np.int32), "stream": np.array([True])}
    assert all("output_ids" in r for r in _run(inputs))
    inputs["return_output_ids"] = np.array([False])
    assert not any("output_ids" in r for r in _run(inputs))
    text = {"text_input": np.array([b"hi"], dtype=np.object_), "stream": np.array([True])}
    assert not any("output_ids" in r for r in _run(text))
