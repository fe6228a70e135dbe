"""The models the suite drives by default, and what a model needs loaded beside it.

The scenarios take their model names from the caller (``soak --models``,
``--engine-model``); these are the defaults: the vLLM model, whose engine gauges the
scenarios read, and the ensemble in front of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tritonforge.paths import MODEL_REPOSITORY

LLM = "vllm_model"
ENSEMBLE = "ensemble_vllm"


def ensemble_steps(model: str, repository: Path = MODEL_REPOSITORY) -> list[str]:
    """The models an ensemble's steps run, as its config.pbtxt names them ([] otherwise)."""
    from tritonforge.repo import pbtxt

    path = repository / model / "config.pbtxt"
    if not path.is_file():
        return []
    return [step.model_name for step in pbtxt.read(path).ensemble_scheduling.step]


def models_to_load(models: Sequence[str], repository: Path = MODEL_REPOSITORY) -> list[str]:
    """The served models plus the steps an ensemble among them runs, each once."""
    loaded: list[str] = []
    for model in models:
        for name in (*ensemble_steps(model, repository), model):
            if name not in loaded:
                loaded.append(name)
    return loaded
