"""LoRA adapters a model serves: upstream vllm_backend's ``multi_lora.json``, read once.

A model's version directory may hold ``multi_lora.json`` beside its engine settings,
mapping adapter names to adapter directories (``{"pirate": "/adapters/pirate"}``), as
upstream vllm_backend reads it, so its repositories work unchanged. Paths follow the
project's one rule (``$VAR`` expanded, relative to the version directory). A request
names an adapter with the ``lora_name`` input or sampling key; the engine checks the
name against this list before the request is queued (:meth:`Engine.prepare`), so an
unknown name is an INVALID_ARG that lists the names, never a failure inside the engine.

Every adapter gets an integer id from its position in the file. vLLM and TensorRT-LLM
key their adapter caches by that id, so it must stay the same for a name for the
model's whole life; the file is read only at load, which guarantees that.

Adapters loaded at run time (:mod:`tritonforge.serving.lora_control`) are checked by
:func:`new_adapter` with the same rules, get ids no adapter of this model's life has
had, and are written back to the file (:func:`write_listing`, atomically) so the next
load serves them too, in the file's order.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from tritonforge.engines.config import resolve_path
from tritonforge.serving.errors import RequestError

LORA_FILE = "multi_lora.json"
#: llama.cpp reads an adapter as GGUF: this file inside the adapter's directory
#: (``python -m tritonforge.launch.lora_store`` writes it beside the safetensors).
GGUF_ADAPTER_FILE = "adapter.gguf"
#: Adapter names appear in metric labels and error messages: keep them plain.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
#: Words the errors of a run-time load or unload use for what is not there: the OpenAI
#: frontend answers them 404, as vLLM's server does.
UNKNOWN_ADAPTER = "unknown LoRA adapter"
NO_ADAPTER_AT = "no LoRA adapter at"


@dataclass(frozen=True)
class LoraAdapter:
    """One adapter: its name, its stable integer id (from 1) and its directory."""

    name: str
    int_id: int
    path: Path
    #: LoRA rank from ``adapter_config.json`` (``r``), checked against engine limits at load.
    rank: int


def _rank(name: str, path: Path) -> int:
    config = path / "adapter_config.json"
    if not config.is_file():
        raise FileNotFoundError(
            f"{LORA_FILE}: adapter {name!r}: {path} is not a PEFT adapter directory "
            "(no adapter_config.json)"
        )
    try:
        rank = json.loads(config.read_text(encoding="utf-8")).get("r")
    except json.JSONDecodeError as exc:
        raise ValueError(f"{config} is not valid JSON: {exc}") from None
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"{config}: 'r' (the LoRA rank) must be a positive integer")
    return rank


def load_adapters(version_dir: Path) -> tuple[LoraAdapter, ...]:
    """The adapters listed in ``version_dir/multi_lora.json`` (none if there is no file).

    Every problem is raised at load, naming the file and the adapter, so a model with
    a broken adapter list never reaches READY and fails its first LoRA request instead.
    """
    path = version_dir / LORA_FILE
    if not path.is_file():
        return ()
    try:
        listed = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(listed, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in listed.items()
    ):
        raise ValueError(f'{path} must map adapter names to directories: {{"name": "/path"}}')
    adapters = []
    for int_id, (name, raw) in enumerate(listed.items(), start=1):
        if not NAME_PATTERN.fullmatch(name):
            raise ValueError(
                f"{path}: adapter name {name!r} must be letters, digits, '_', '.', '-' "
                "(it appears in metric labels)"
            )
        adapter_dir = Path(resolve_path(raw, version_dir))
        adapters.append(LoraAdapter(name, int_id, adapter_dir, _rank(name, adapter_dir)))
    return tuple(adapters)


def read_listing(version_dir: Path) -> dict[str, str]:
    """``multi_lora.json`` as written (names to unexpanded paths); empty if there is none.

    A run-time load or unload rewrites the file from this, so the paths other adapters
    were given with (``$VAR``, relative) stay as they were written.
    """
    path = version_dir / LORA_FILE
    if not path.is_file():
        return {}
    listed = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(listed, dict):
        raise ValueError(f'{path} must map adapter names to directories: {{"name": "/path"}}')
    return {str(k): str(v) for k, v in listed.items()}


def write_listing(version_dir: Path, listed: dict[str, str]) -> None:
    """Replace ``multi_lora.json`` atomically (a temporary file renamed over it).

    A server that dies mid-write must not leave a half file that fails the next load.
    An empty listing removes the file: a model without adapters has none upstream either.
    """
    path = version_dir / LORA_FILE
    if not listed:
        path.unlink(missing_ok=True)
        return
    staging = path.with_name(f".{LORA_FILE}.tmp")
    staging.write_text(json.dumps(listed, indent=2) + "\n", encoding="utf-8")
    staging.replace(path)


def new_adapter(
    name: str, raw_path: str, version_dir: Path, served: dict[str, LoraAdapter], int_id: int
) -> LoraAdapter:
    """An adapter to load at run time, checked as ``multi_lora.json``'s are at load.

    Raises :class:`RequestError` naming ``lora_name`` (a bad or taken name) or
    ``lora_path`` (nothing there, not a PEFT adapter, not a usable path).
    """
    if not NAME_PATTERN.fullmatch(name):
        raise RequestError(
            "lora_name",
            f"{name!r} must be 1-128 letters, digits, '_', '.', '-' starting with a letter "
            "or digit (it appears in metric labels)",
        )
    if name in served:
        raise RequestError(
            "lora_name",
            f"LoRA adapter {name!r} is already loaded (from {served[name].path}); unload it "
            "first to load other weights under that name",
        )
    try:
        path = Path(resolve_path(raw_path, version_dir))
    except ValueError as exc:  # an unset $VAR
        raise RequestError("lora_path", str(exc)) from None
    if not path.is_absolute():
        raise RequestError(
            "lora_path",
            f"{raw_path!r} must be absolute, start with $VAR, or name a directory relative "
            "to the model's version directory",
        )
    if not path.is_dir():
        raise RequestError("lora_path", f"{NO_ADAPTER_AT} {path} (no such directory)")
    try:
        rank = _rank(name, path)
    except FileNotFoundError:
        raise RequestError(
            "lora_path", f"{NO_ADAPTER_AT} {path} (no adapter_config.json: not a PEFT adapter)"
        ) from None
    except ValueError as exc:
        raise RequestError("lora_path", str(exc)) from None
    return LoraAdapter(name, int_id, path, rank)
