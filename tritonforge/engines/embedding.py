"""The contract between the Triton edge of an embedding model and its engine.

An embedding model is a plain request → response batch: no streaming, no sampling, no
cancellation mid-way. So it does not share :class:`~tritonforge.engines.base.Engine`
(whose requests are decoupled streams); what it shares with the LLM engines is how a
model's settings are read (``model.json``, paths resolved the same way) and the
prompt rules a client sees (a prompt has tokens, fits the context, ids are in the
vocabulary), worded as every model words them: the field, then the rule.

An adapter implements :meth:`Embedder.embed`: every prompt of a batch in ONE engine
call, which is the point of serving embeddings behind Triton's dynamic batcher.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

import numpy as np
import numpy.typing as npt

from tritonforge.engines.base import ConfigFile, TokenLimits
from tritonforge.engines.config import resolve_paths
from tritonforge.serving.errors import RequestError

#: One embedding vector, float32 as the ``embedding`` output carries it.
Vector = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Embedded:
    """One prompt's embedding and how many tokens the engine embedded for it."""

    vector: Vector
    prompt_tokens: int


class Embedder(TokenLimits):
    """One loaded embedding model on one engine (``max_context``: the longest prompt)."""

    #: The engine's configuration file in the version directory.
    config_file: ClassVar[ConfigFile]

    @classmethod
    def from_config(cls, config: Mapping[str, Any], model_dir: Path) -> Self:
        """Build (not start) the engine, paths resolved as for every engine."""
        return cls.from_settings(resolve_paths(dict(config), model_dir, cls.config_file.path_keys))

    @classmethod
    @abc.abstractmethod
    def from_settings(cls, settings: dict[str, Any]) -> Self:
        """Build the engine from its settings (paths resolved; the dict is the caller's copy)."""

    @abc.abstractmethod
    def start(self) -> None:
        """Load weights; raise with a clear message on failure."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Stop the engine and every process it started."""

    @abc.abstractmethod
    def tokenize(self, text: str) -> list[int]:
        """The engine's own tokenizer, as it tokenizes a text prompt."""

    @abc.abstractmethod
    def embed(self, prompts: Sequence[Sequence[int]]) -> list[Embedded]:
        """Every prompt's embedding, in order, from one engine call."""

    def prepare_text(self, text: str, field: str = "text_input") -> tuple[int, ...]:
        """A text prompt as checked token ids (errors name ``field``)."""
        return self._checked(tuple(self.tokenize(text)), field)

    def prepare_ids(self, ids: Sequence[int], field: str = "input_ids") -> tuple[int, ...]:
        """A token-id prompt, checked against the vocabulary and the context."""
        for token in ids:
            if not 0 <= token < self.vocab_size:
                raise RequestError(
                    field, f"token id {token} is out of range [0, {self.vocab_size})"
                )
        return self._checked(tuple(int(t) for t in ids), field)

    def _checked(self, ids: tuple[int, ...], field: str) -> tuple[int, ...]:
        if not ids:
            raise RequestError(field, "the prompt has no tokens; send a non-empty prompt")
        if len(ids) > self.max_context:
            raise RequestError(
                field,
                f"prompt is {len(ids)} tokens; the model embeds at most {self.max_context} tokens",
            )
        return ids
