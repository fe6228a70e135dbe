"""LoRA adapters loaded and unloaded at run time: the model's control requests.

A control request is an ordinary request to the model that carries the optional
``lora_control`` input (``load``, ``unload`` or ``list``) with ``lora_name`` and, to
load, ``lora_path``: vLLM's ``/v1/load_lora_adapter`` body as tensors. It travels the
model's normal inference path, so it reaches the model instance that owns the running
engine with no reload and no side channel, and any Triton client can send one (gRPC,
HTTP ``/generate``, the OpenAI frontend's adapter routes). It produces no tokens: its
one response's ``text_output`` is JSON naming the adapters the model serves afterwards.

A load is checked as ``multi_lora.json``'s entries are at load (name, directory, rank),
then handed to the running engine, then written to the model's ``multi_lora.json``, so a
model reload or a server restart (the launcher's supervisor loads the same models again)
serves it too. An unload takes it out of the file as well. Operations on one model run
one at a time; requests keep running throughout. A failed load leaves the model serving
what it served, and the file as it was.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tritonforge.engines.base import Engine
from tritonforge.engines.lora import (
    LORA_FILE,
    UNKNOWN_ADAPTER,
    new_adapter,
    read_listing,
    write_listing,
)
from tritonforge.serving.errors import RequestError

CONTROL_INPUT = "lora_control"
PATH_INPUT = "lora_path"
NAME_INPUT = "lora_name"
ACTIONS = ("load", "unload", "list")
#: Inputs a control request may carry besides its own (flags every client sends).
_HARMLESS = frozenset({"stream", "exclude_input_in_output"})


@dataclass(frozen=True)
class ControlRequest:
    """One control operation: what to do, to which adapter, from where."""

    action: str
    name: str | None = None
    path: str | None = None


def _text(name: str, array: npt.NDArray[Any]) -> str:
    values = np.asarray(array).reshape(-1)
    if values.size != 1:
        raise RequestError(name, f"expected one string, got {values.size} elements")
    value = values[0]
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RequestError(name, f"is not valid UTF-8 (byte {exc.start})") from None
    if not isinstance(value, str):
        raise RequestError(name, f"expected a string (BYTES), got {values.dtype}")
    return value


def parse_control(inputs: Mapping[str, npt.NDArray[Any]]) -> ControlRequest | None:
    """The control request these inputs make, or None for a request that generates."""
    if CONTROL_INPUT not in inputs:
        if PATH_INPUT in inputs:
            raise RequestError(
                PATH_INPUT, f"only a control request takes a path (send {CONTROL_INPUT}: load)"
            )
        return None
    action = _text(CONTROL_INPUT, inputs[CONTROL_INPUT])
    if action not in ACTIONS:
        raise RequestError(CONTROL_INPUT, f"must be one of {', '.join(ACTIONS)}, got {action!r}")
    extra = sorted(set(inputs) - {CONTROL_INPUT, PATH_INPUT, NAME_INPUT} - _HARMLESS)
    if extra:
        raise RequestError(
            extra[0], f"a {CONTROL_INPUT} request generates nothing; send {extra[0]} on its own"
        )
    name = _text(NAME_INPUT, inputs[NAME_INPUT]) if NAME_INPUT in inputs else None
    path = _text(PATH_INPUT, inputs[PATH_INPUT]) if PATH_INPUT in inputs else None
    if action != "list" and not name:
        raise RequestError(NAME_INPUT, f"{CONTROL_INPUT} {action} needs the adapter's name")
    if action == "load" and not path:
        raise RequestError(PATH_INPUT, "loading an adapter needs its directory")
    if action != "load" and path is not None:
        raise RequestError(PATH_INPUT, f"only {CONTROL_INPUT} load takes a path")
    return ControlRequest(action, name, path)


class AdapterControl:
    """Runs control requests for one model: its engine and its version directory."""

    def __init__(self, engine: Engine, version_dir: Path) -> None:
        self._engine = engine
        self._version_dir = version_dir
        # Ids are never reused within the model's life: vLLM caches adapters by id.
        self._next_id = max((a.int_id for a in engine.adapters.values()), default=0) + 1
        self._lock: asyncio.Lock | None = None

    async def run(self, request: ControlRequest) -> dict[str, Any]:
        """Do what the request asks (on the runtime's loop); the model's adapters after it."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if request.action == "load":
                assert request.name is not None and request.path is not None
                await self._load(request.name, request.path)
            elif request.action == "unload":
                assert request.name is not None
                await self._unload(request.name)
        return self.listing(request)

    def listing(self, request: ControlRequest) -> dict[str, Any]:
        """The answer: what was done, and every adapter the model now serves (name → path)."""
        return {
            "action": request.action,
            "lora_name": request.name,
            "adapters": {name: str(a.path) for name, a in self._engine.adapters.items()},
            "loads_adapters": self._engine.loads_adapters,
        }

    async def _load(self, name: str, raw_path: str) -> None:
        served = dict(self._engine.adapters)
        adapter = new_adapter(name, raw_path, self._version_dir, served, self._next_id)
        self._next_id += 1
        await self._engine.load_adapter(adapter)
        try:
            write_listing(self._version_dir, {**read_listing(self._version_dir), name: raw_path})
        except (OSError, ValueError) as exc:
            await self._engine.unload_adapter(name)
            raise RuntimeError(
                f"{LORA_FILE} of this model could not be written ({exc}); adapter {name!r} "
                "was not loaded"
            ) from None

    async def _unload(self, name: str) -> None:
        served = self._engine.adapters
        if name not in served:
            available = ", ".join(sorted(served)) or "none"
            raise RequestError(NAME_INPUT, f"{UNKNOWN_ADAPTER} {name!r}; available: {available}")
        await self._engine.unload_adapter(name)
        listed = read_listing(self._version_dir)
        if name in listed:
            del listed[name]
            write_listing(self._version_dir, listed)
