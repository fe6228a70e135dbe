"""Read an engine's configuration file from a model's version directory.

Upstream formats are kept (vLLM ``model.json``, TensorRT-LLM ``model.yaml``). Two
additions make a model repository portable: ``$VAR``/``${VAR}`` in path values are
expanded from the environment, and relative paths resolve against the version
directory, so the same repository works in a clone and in a container.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

_VARIABLE = re.compile(r"\$(\w+)|\$\{([^}]*)\}")


def expand_env(value: str, env: Mapping[str, str] | None = None) -> str:
    """Expand ``$VAR`` and ``${VAR}`` from ``env`` (the process environment by default).

    The project's one expansion rule, for every Python reader of a model's settings.
    An unset variable is an error that names it: ``os.path.expandvars`` would keep
    ``$VAR`` in the text, and the failure would surface later as a path that is not there.
    """
    source = os.environ if env is None else env

    def lookup(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in source:
            raise ValueError(f"environment variable {name} (used in {value!r}) is not set")
        return source[name]

    return _VARIABLE.sub(lookup, value)


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


def resolve_path(value: str, base: Path, env: Mapping[str, str] | None = None) -> str:
    """``value`` with ``$VAR`` expanded; relative paths resolve against ``base`` if there.

    ``env`` lets a checker resolve paths as the server will see them (the launcher's
    environment) without changing its own process environment.
    """
    path = Path(expand_env(value, env)).expanduser()
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
