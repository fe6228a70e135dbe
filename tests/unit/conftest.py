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


# --- model repositories (tests/unit/repo/test_repo_*.py) ----------------------------------

#: The smallest byte-level BPE tokenizer.json the C++ tokenizer accepts.
TINY_TOKENIZER = {
    "version": "1.0",
    "truncation": None,
    "padding": None,
    "added_tokens": [],
    "normalizer": None,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
    "post_processor": None,
    "decoder": {"type": "ByteLevel"},
    "model": {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "fuse_unk": False,
        "byte_fallback": False,
        "vocab": {"a": 0, "b": 1, "ab": 2},
        "merges": ["a b"],
    },
}


@pytest.fixture
def models_root(tmp_path: Path) -> Path:
    """$TRITONFORGE_MODELS of the repository tests: an HF-style directory and a GGUF."""
    import json

    root = tmp_path / "models"
    hf = root / "tiny-hf"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    (hf / "tokenizer.json").write_text(json.dumps(TINY_TOKENIZER))
    (root / "tiny.gguf").write_bytes(b"GGUF" + bytes(60))
    return root


@pytest.fixture
def repo_env(models_root: Path) -> dict[str, str]:
    """The environment the checks expand paths with: never the developer's own."""
    return {"TRITONFORGE_MODELS": str(models_root)}
