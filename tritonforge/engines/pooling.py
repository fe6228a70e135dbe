"""The settings that make vLLM embed with a decoder model: its pooling runner, one pooler.

Why these: SmolLM2 is a causal decoder, so only its *last* token's hidden state has
attended to the whole prompt; a mean over the tokens averages states that each saw only
a prefix, and the first token (``CLS`` pooling) saw nothing but itself. So the model is
served on vLLM's pooling runner (``"runner": "pooling"``), converted for embedding
(``"convert": "embed"``, vLLM's ``as_embedding_model``), with last-token pooling
(``seq_pooling_type: "LAST"``) and L2 normalisation (``use_activation: true``, the
setting vLLM 0.32 calls what was ``normalize``): vLLM's own default for a converted
decoder, written out so a ``sentence-transformers`` file beside the weights, or a later
vLLM default, cannot change what the model answers.

Pure: settings in, settings out, so each rule is unit-tested without importing vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The pooler a decoder model embeds with (the module docstring says why).
DEFAULT_POOLER = {"seq_pooling_type": "LAST", "use_activation": True}


def pooling_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``model.json``'s settings for an embedding model: runner, convert and pooler set.

    A runner or conversion other than the pooling runner's embedding is a mistake the
    load reports (naming the key), not a setting silently replaced.
    """
    resolved = dict(settings)
    for key, wanted in (("runner", "pooling"), ("convert", "embed")):
        value = resolved.setdefault(key, wanted)
        if value != wanted:
            raise ValueError(
                f'model.json: "{key}" must be "{wanted}" for an embedding model, got {value!r}'
            )
    pooler = resolved.get("pooler_config", {})
    if not isinstance(pooler, dict):
        raise ValueError(f'model.json: "pooler_config" must be an object, got {pooler!r}')
    resolved["pooler_config"] = DEFAULT_POOLER | pooler
    return resolved
