"""Every ``python -m tritonforge...`` that an image, a manifest or a script runs names a
module that exists: a renamed module breaks a container's start, which no test that runs
here would otherwise see (the images build on GPU machines only)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PLACES = ["docker", "deploy", "scripts", ".ci"]
MODULE = re.compile(r"python3? -m (tritonforge(?:\.\w+)+)")


def commands() -> list[tuple[str, str]]:
    found = []
    for place in PLACES:
        for path in sorted((REPO / place).rglob("*")):
            if path.is_file() and path.suffix not in {".md"}:
                text = path.read_text(errors="replace")
                found += [(str(path.relative_to(REPO)), m) for m in MODULE.findall(text)]
    return found


def test_the_images_run_modules_of_this_package() -> None:
    assert any(where.startswith("docker/") for where, _ in commands())


@pytest.mark.parametrize(("where", "module"), commands())
def test_module_exists(where: str, module: str) -> None:
    assert importlib.util.find_spec(module) is not None, f"{where} runs {module}, which is missing"
