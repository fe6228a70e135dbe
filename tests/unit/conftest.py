"""Fixtures of the unit tests that more than one module uses."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tokenizer_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """name -> tokenizer.json: the served SmolLM2 file and the locally built ones."""
    # Imported here, not at the top: it needs the built C++ tokenizer, most tests do not.
    from tests.tokenizers_under_test import build_tokenizer_files

    return build_tokenizer_files(tmp_path_factory.mktemp("tokenizers"))
