"""Paths in generated files: written portably, resolved as the server will see them.

The shipped repository names its models ``$TRITONFORGE_MODELS/...`` and
``$TRITONFORGE_GGUF`` so one repository works in a clone and in a container. The
generator writes paths the same way when it can, and the checks expand them with the
environment the launcher gives the server, using :mod:`tritonforge.engines.config`'s
rules (one expansion rule for the whole project).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path

from tritonforge.engines.config import resolve_path
from tritonforge.launch.model_store import gguf_path, models_dir

MODELS_VAR = "TRITONFORGE_MODELS"
GGUF_VAR = "TRITONFORGE_GGUF"


def server_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a model's paths may use, with the launcher's defaults.

    ``tritonforge.launch.launcher`` sets ``TRITONFORGE_MODELS`` (the converted-models folder)
    and ``TRITONFORGE_GGUF`` (the wheel's GGUF) for the server when they are unset; a
    check must expand paths with the same values or it would judge another file.
    """
    env = dict(os.environ if base is None else base)
    env.setdefault(MODELS_VAR, str(models_dir()))
    if GGUF_VAR not in env:
        with contextlib.suppress(FileNotFoundError):
            env[GGUF_VAR] = str(gguf_path())
    return env


def portable(given: str, env: Mapping[str, str], cwd: Path | None = None) -> str:
    """The path as it goes into model.json: ``$VAR``-relative when that is possible.

    A path the user wrote with ``$VAR`` stays as written. Otherwise it is made absolute
    (model.json resolves relative paths against the version directory, not the
    user's working directory) and expressed under ``$TRITONFORGE_MODELS`` or as
    ``$TRITONFORGE_GGUF`` when it is there, so the repository moves with the models.
    """
    if "$" in given:
        return given
    path = Path(given).expanduser()
    if not path.is_absolute():
        path = (cwd or Path.cwd()) / path
    path = Path(os.path.normpath(path))
    gguf = env.get(GGUF_VAR)
    if gguf and path == Path(os.path.normpath(gguf)):
        return f"${GGUF_VAR}"
    models = env.get(MODELS_VAR)
    if models:
        with contextlib.suppress(ValueError):
            relative = path.relative_to(Path(os.path.normpath(models)))
            return f"${MODELS_VAR}/{relative.as_posix()}" if relative.parts else f"${MODELS_VAR}"
    return str(path)


def resolve(value: str, base: Path, env: Mapping[str, str]) -> Path:
    """``value`` from a model's files as the server resolves it (ValueError: unset $VAR).

    A relative path that is not under ``base`` would resolve against the server's
    working directory, which a check cannot know: it is judged under ``base``, the
    documented rule, so the message names the place the user meant.
    """
    path = Path(resolve_path(value, base, env))
    return path if path.is_absolute() else base / path
