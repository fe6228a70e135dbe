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
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from tritonforge.engines.config import resolve_path

LORA_FILE = "multi_lora.json"
#: llama.cpp reads an adapter as GGUF: this file inside the adapter's directory
#: (``python -m tritonforge.launch.lora_store`` writes it beside the safetensors).
GGUF_ADAPTER_FILE = "adapter.gguf"
#: Adapter names appear in metric labels and error messages: keep them plain.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


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
