"""Request dialects: input tensors some Triton clients send instead of the common schema.

Clients written for an engine's upstream Triton model (TensorRT-LLM's
``sampling_param_*`` tensors, genai-perf's ``--backend tensorrtllm`` format) keep
working when a dialect maps their tensors onto the common schema. That mapping is a
Triton-format concern, so it runs at the Triton edge (:mod:`tritonforge.triton.model`),
before parsing: engines only ever see the parsed
:class:`~tritonforge.serving.schema.GenerateRequest`. A backend names its dialect where it binds
its engine (``make_model(Engine, dialect)``); one module per dialect.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy.typing as npt

#: Input tensors → (common-schema input tensors, typed sampling values read from
#: dialect tensors). Runs on Triton's thread; errors are RequestErrors naming the tensor.
Translate = Callable[
    [Mapping[str, npt.NDArray[Any]]], tuple[dict[str, npt.NDArray[Any]], dict[str, Any]]
]


def _common_only(
    inputs: Mapping[str, npt.NDArray[Any]],
) -> tuple[dict[str, npt.NDArray[Any]], dict[str, Any]]:
    return dict(inputs), {}


@dataclass(frozen=True)
class Dialect:
    """The extra tensors a model accepts and how they map onto the common schema."""

    #: Triton config input specs beyond the common schema, added by auto-complete.
    inputs: tuple[dict[str, Any], ...]
    translate: Translate


#: The common schema alone: what every model accepts.
COMMON = Dialect(inputs=(), translate=_common_only)
