"""Read an engine's configuration file from a model's version directory.

Upstream formats are kept (vLLM ``model.json``, TensorRT-LLM ``model.yaml``). Two
additions make a model repository portable: ``$VAR``/``${VAR}`` in path values are
expanded from the environment, and relative paths resolve against the version
directory, so the same repository works in a clone and in a container.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml


def load_engine_config(version_dir: Path, filename: str) -> dict[str, Any]:
    path = version_dir / filename
    if not path.is_file():
        raise FileNotFoundError(f"engine configuration {path} is missing")
    text = path.read_text()
    try:
        data = yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"{path} is not valid: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a mapping of engine arguments")
    return data


def resolve_path(value: str, base: Path) -> str:
    expanded = os.path.expandvars(value)
    if "$" in expanded:
        raise ValueError(f"path {value!r} names an environment variable that is not set")
    path = Path(expanded).expanduser()
    if not path.is_absolute() and (base / path).exists():
        path = base / path
    return str(path)


def resolve_paths(config: dict[str, Any], base: Path, keys: Iterable[str]) -> dict[str, Any]:
    """Expand and resolve the path-valued ``keys`` of ``config`` (a copy is returned)."""
    resolved = dict(config)
    for key in keys:
        if isinstance(resolved.get(key), str):
            resolved[key] = resolve_path(resolved[key], base)
    return resolved
