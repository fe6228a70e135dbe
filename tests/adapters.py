"""Small LoRA adapters and string tensors for the unit tests of the adapter code paths.

An adapter here is only what the checks read (``adapter_config.json`` with its rank and
type): the engines' own tests load real weights (tritonforge.launch.lora_store).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def text(value: str) -> np.ndarray:
    """A one-element TYPE_STRING tensor, as Triton hands a request's input to a model."""
    return np.array([value.encode()], dtype=np.object_)


def adapter_dir(root: Path, name: str, rank: int = 8) -> Path:
    """A PEFT LoRA directory named ``name`` under ``root`` with rank ``rank``."""
    path = root / name
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": rank, "peft_type": "LORA"}))
    return path
