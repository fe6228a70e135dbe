"""TEST DOUBLES — stand-ins for the runtime's collaborators, shared by the server-free tests.

None of this is an engine or Triton: :class:`ScriptedEngine` replays fixed deltas,
:class:`RecordingChannel` plays Triton's response sender, :class:`RecordingMetrics`
and :class:`RecordingLogger` keep what the runtime reports. They let the real
:class:`~tritonforge.serving.runtime.Runtime` run in a test without a server or a model.
(The TensorRT-LLM contract test drives the real adapter against
tests/contract/trtllm_standin.py, a stand-in of the documented LLM API instead.)
:func:`edge_module` loads the Triton edge against a stand-in of the few
``triton_python_backend_utils`` names a test needs.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
import types
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import numpy as np

from tritonforge.engines.base import (
    ConfigFile,
    Engine,
    EngineOutput,
    EngineStats,
    PreparedPrompt,
)
from tritonforge.serving.runtime import RequestRecord, Runtime
from tritonforge.serving.sampling import SamplingParams
from tritonforge.serving.schema import GenerateRequest, parse_request


class ScriptedEngine(Engine):
    """Answers every request with the same deltas; one token per prompt character.

    ``delay_s`` waits before each delta (a slow engine, for deadlines). ``aborted`` and
    ``closed`` keep the ids of requests the runtime aborted and whose iterator ended
    early (closed or cancelled before its last delta): the engine work was freed.
    """

    config_file = ConfigFile("none")

    def __init__(self, script: Sequence[EngineOutput] = (), delay_s: float = 0.0) -> None:
        self.script = list(script)
        self.delay_s = delay_s
        self.aborted: list[str] = []
        self.closed: list[str] = []

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

    def render_chat(self, messages: tuple[dict[str, str], ...]) -> str:
        return ""

    async def generate(
        self, request_id: str, prompt: PreparedPrompt, sampling: SamplingParams
    ) -> AsyncIterator[EngineOutput]:
        done = False
        try:
            for delta in self.script:
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                yield delta
            done = True
        finally:
            if not done:
                self.closed.append(request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


class RecordingChannel:
    """A request's response sender: keeps every send; cancelled after ``cancel_after``."""

    def __init__(self, cancel_after: int | None = None) -> None:
        self.sent: list[tuple[dict[str, np.ndarray] | None, BaseException | None, bool]] = []
        self.cancel_after = cancel_after
        self.done = threading.Event()  # set by the final response

    def send(
        self, tensors: dict[str, np.ndarray] | None, error: BaseException | None, final: bool
    ) -> None:
        self.sent.append((tensors, error, final))
        if final:
            self.done.set()

    def is_cancelled(self) -> bool:
        return self.cancel_after is not None and len(self.sent) >= self.cancel_after

    def responses(self) -> list[dict[str, np.ndarray]]:
        """The output tensors sent, in order (errors and empty finals left out)."""
        return [tensors for tensors, _, _ in self.sent if tensors is not None]

    def errors(self) -> list[BaseException]:
        return [error for _, error, _ in self.sent if error is not None]


class RecordingMetrics:
    """The runtime's metrics sink: keeps every request record."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def record(self, record: RequestRecord) -> None:
        self.records.append(record)

    def set_stats(self, stats: EngineStats) -> None:
        pass

    def wait_for(self, count: int, timeout_s: float = 30) -> None:
        """Wait (bounded) until ``count`` requests have finished in the runtime."""
        deadline = time.monotonic() + timeout_s
        while len(self.records) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(self.records) == count


class RecordingLogger:
    """The runtime's logger: keeps its lines (a test can require there were no errors)."""

    def __init__(self) -> None:
        self.infos: list[str] = []
        self.errors: list[str] = []

    def log_info(self, msg: str) -> None:
        self.infos.append(msg)

    def log_error(self, msg: str) -> None:
        self.errors.append(msg)


def word_script(tokens: int) -> list[EngineOutput]:
    """``tokens`` deltas "w0 ", "w1 ", … then "end", the last one finishing on length."""
    return [EngineOutput(text=f"w{i} ", token_ids=[i]) for i in range(tokens - 1)] + [
        EngineOutput(text="end", token_ids=[tokens - 1], finished=True, finish_reason="length")
    ]


def sampling_request(stream: bool, **sampling: object) -> GenerateRequest:
    """A parsed request for the prompt "hi" with ``sampling`` as its JSON parameters."""
    inputs = {
        "text_input": np.array([b"hi"], dtype=np.object_),
        "sampling_parameters": np.array([json.dumps(sampling).encode()], dtype=np.object_),
        "stream": np.array([stream]),
    }
    return parse_request(inputs)


def serve_once(
    engine: Engine,
    request: GenerateRequest,
    channel: RecordingChannel,
    metrics: RecordingMetrics | None = None,
    logger: RecordingLogger | None = None,
    **runtime_settings: Any,
) -> RecordingChannel:
    """One request on a fresh :class:`Runtime`, stopped once its FINAL response went out."""
    runtime = Runtime(
        engine, metrics or RecordingMetrics(), logger or RecordingLogger(), **runtime_settings
    )
    runtime.start()
    try:
        runtime.submit(request, channel)
        assert channel.done.wait(10), "no FINAL response within 10 s"
    finally:
        runtime.stop()
    return channel


def edge_module(monkeypatch: Any, **names: object) -> Iterator[types.ModuleType]:
    """tritonforge.triton.model bound to a stand-in triton_python_backend_utils.

    ``names`` are the stand-in's attributes (``TritonError``, ``Tensor``…). A fixture
    yields from this; the module bound to the stand-in is dropped afterwards.
    """
    fake = types.ModuleType("triton_python_backend_utils")
    for name, value in names.items():
        setattr(fake, name, value)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    monkeypatch.delitem(sys.modules, "tritonforge.triton.model", raising=False)
    import tritonforge.triton.model as module

    yield module
    sys.modules.pop("tritonforge.triton.model", None)
