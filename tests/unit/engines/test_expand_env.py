"""One ``$VAR`` rule for every Python reader of model settings: expand, or name the unset."""

from __future__ import annotations

from pathlib import Path

import pytest

from tritonforge.bench.services import load_engine_settings
from tritonforge.engines.config import expand_env


def test_plain_and_braced_names_expand_from_the_given_environment() -> None:
    assert expand_env("$A/${B}.json", {"A": "/models", "B": "m"}) == "/models/m.json"
    assert expand_env("no variables", {}) == "no variables"


def test_an_unset_variable_is_an_error_that_names_it() -> None:
    with pytest.raises(ValueError, match=r"TF_TEST_UNSET \(used in '\$\{TF_TEST_UNSET\}/m'\)"):
        expand_env("${TF_TEST_UNSET}/m", {})


def test_the_reference_server_reads_model_json_by_the_same_rule(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    path.write_text('{"model": "$TF_MODELS/m", "max_model_len": 64, "enforce_eager": true}')
    settings = load_engine_settings(path, {"TF_MODELS": "/models"})
    assert settings == {"model": "/models/m", "max_model_len": 64, "enforce_eager": True}
    with pytest.raises(ValueError, match="TF_MODELS"):
        load_engine_settings(path, {})
