"""The project's runtime over an engine that costs nothing: one token per loop turn.

``make_model`` + ``Runtime`` + responses + the Triton channel, exactly as a backend
serves them; only the engine is absent, so what the server spends per token is the
serving path's own cost. Tokens are bytes (vocabulary 256), the text one ASCII letter.
"""

from __future__ import annotations

import os
import sys

# The same engine over another checkout's runtime (the code before a change), when the
# measurement names one: an A/B of two runtimes inside one server.
if os.environ.get("HOTPATH_OLD_TREE"):
    sys.path.insert(0, os.environ["HOTPATH_OLD_TREE"])

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from tritonforge.engines.base import ConfigFile, Engine, EngineOutput, PreparedPrompt
from tritonforge.serving.sampling import SamplingParams
from tritonforge.triton.model import make_model


class ZeroEngine(Engine):
    config_file = ConfigFile("model.json")
    metric_prefix = "zero"
    step_s = 0.0

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> ZeroEngine:
        engine = cls()
        # The cancellation poll's period (seconds): a long one measures what polling costs.
        engine.cancellation_poll_s = float(settings.get("cancellation_poll_s", 0.1))
        engine.step_s = float(settings.get("step_ms", 0)) / 1000  # 0: a token per loop turn
        return engine

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...

    @property
    def max_context(self) -> int:
        return 1 << 20

    @property
    def vocab_size(self) -> int:
        return 256

    def tokenize(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(text.encode())

    def render_chat(self, messages: tuple[dict[str, str], ...]) -> str:
        return "".join(m["content"] for m in messages)

    async def generate(
        self, request_id: str, prompt: PreparedPrompt, sampling: SamplingParams
    ) -> AsyncIterator[EngineOutput]:
        n = sampling.max_tokens
        for i in range(n):
            await asyncio.sleep(self.step_s)
            last = i == n - 1
            yield EngineOutput("a", [97], finished=last, finish_reason="length" if last else None)

    async def abort(self, request_id: str) -> None: ...


TritonPythonModel = make_model(ZeroEngine)
