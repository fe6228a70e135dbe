"""An embedding model's vLLM settings: the pooling runner, conversion and pooler it embeds with."""

from __future__ import annotations

import pytest

from tritonforge.engines.pooling import DEFAULT_POOLER, pooling_settings


def test_missing_keys_get_the_pooling_runner_and_last_token_normalised_pooling() -> None:
    resolved = pooling_settings({"model": "/m"})
    assert resolved["runner"] == "pooling" and resolved["convert"] == "embed"
    assert resolved["pooler_config"] == {"seq_pooling_type": "LAST", "use_activation": True}


def test_pooler_keys_set_in_model_json_win_over_the_defaults() -> None:
    resolved = pooling_settings({"pooler_config": {"seq_pooling_type": "MEAN"}})
    assert resolved["pooler_config"] == DEFAULT_POOLER | {"seq_pooling_type": "MEAN"}


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"runner": "generate"}, '"runner" must be "pooling"'),
        ({"convert": "classify"}, '"convert" must be "embed"'),
        ({"pooler_config": "LAST"}, '"pooler_config" must be an object'),
    ],
)
def test_settings_that_would_not_embed_fail_the_load_naming_the_key(settings, message) -> None:
    with pytest.raises(ValueError, match=message):
        pooling_settings(settings)
