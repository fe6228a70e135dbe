"""The runtime's streamed responses carry output_ids only with the text they complete.

This is what lets the ensemble's stateless postprocessing step decode exact text:
for byte-level BPE, decoding each response's ids alone gives its text_output.
Runs the real Runtime on a scripted engine; no server.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from tritonforge.engines.base import ConfigFile, Engine, EngineOutput, PreparedPrompt
from tritonforge.runtime import Runtime
from tritonforge.schema import parse_request

# "é" split over two tokens: the first adds no text, the second completes it.
SCRIPT = [
    EngineOutput(text=" caf", token_ids=[10]),
    EngineOutput(text="", token_ids=[11]),
    EngineOutput(text="é", token_ids=[12]),
    EngineOutput(text="", token_ids=[2], finished=True, finish_reason="stop"),
]


class ScriptedEngine(Engine):
    config_file = ConfigFile("none")

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> ScriptedEngine:
        return cls()

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    @property
    def max_context(self) -> int:
        return 100

    @property
    def vocab_size(self) -> int:
        return 100

    def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        return [1] * len(text)

    def render_chat(self, messages) -> str:
        return ""

    async def generate(self, request_id, prompt: PreparedPrompt, sampling) -> AsyncIterator:
        for delta in SCRIPT:
            yield delta

    async def abort(self, request_id: str) -> None: ...


class Collect:
    def __init__(self) -> None:
        self.responses: list[dict] = []
        self.done = threading.Event()

    def send(self, tensors, error, final) -> None:
        assert error is None, error
        if tensors is not None:
            self.responses.append(tensors)
        if final:
            self.done.set()

    def is_cancelled(self) -> bool:
        return False


class Quiet:
    def record(self, record) -> None: ...

    def set_stats(self, stats) -> None: ...

    def log_info(self, msg: str) -> None: ...

    def log_error(self, msg: str) -> None: ...


def _run(inputs: dict[str, np.ndarray]) -> list[dict]:
    runtime = Runtime(ScriptedEngine(), Quiet(), Quiet())
    runtime.start()
    try:
        channel = Collect()
        runtime.submit(parse_request(inputs), channel)
        assert channel.done.wait(10)
        return channel.responses
    finally:
        runtime.stop()


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
