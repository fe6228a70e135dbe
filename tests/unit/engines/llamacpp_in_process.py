"""The shipped llamacpp_model's engine run in the test process (no server), on a loop
of its own: for unit tests of what llama.cpp does with several sequences."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from tritonforge.engines.config import load_engine_config, resolve_path
from tritonforge.engines.llamacpp import LlamaCppEngine
from tritonforge.launch.launcher import MODEL_REPOSITORY
from tritonforge.repo.paths import server_environment

T = TypeVar("T")


@contextmanager
def shipped_engine(**overrides: Any) -> Iterator[LlamaCppEngine]:
    """The engine with the shipped model.json (its GGUF resolved), ``overrides`` applied."""
    version_dir = MODEL_REPOSITORY / "llamacpp_model" / "1"
    settings = load_engine_config(version_dir, "model.json")
    path = resolve_path(settings["model_path"], version_dir, server_environment())
    settings |= {"model_path": path, **overrides}
    settings.pop("chat_template", None)  # the engine core's, not an engine argument
    engine = LlamaCppEngine.from_settings(settings)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(engine.start())
    engine.loop = loop  # type: ignore[attr-defined]
    try:
        yield engine
    finally:
        loop.run_until_complete(engine.shutdown())
        loop.close()


def run(engine: LlamaCppEngine, coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` on the engine's loop."""
    return engine.loop.run_until_complete(coroutine)  # type: ignore[attr-defined]
