"""``/v1/embeddings``: the body's ``input`` → prompts for an embedding model; vectors →
OpenAI's answer (the typed models of :mod:`~tritonforge.openai.responses`).

Pure functions, no I/O, so every mapping is unit-tested without a server. ``input`` is
what OpenAI's API takes: a string, a list of strings, a list of token ids, or a list of
token-id lists; every way it can be wrong is a 400 naming ``input`` (and the item, in a
list), checked before anything is sent. ``dimensions`` is refused: the served model is
not a Matryoshka model, so a shorter vector would not be a meaningful embedding.

The model names a bad row by its own input and row (``text_input[3]: prompt is 3000
tokens; …``); :func:`input_error` names it as the client sent it (``input[67]``).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from tritonforge.openai.errors import OpenAIError, invalid
from tritonforge.openai.protocol import EmbeddingRequest
from tritonforge.openai.responses import CreateEmbeddingResponse, Embedding, EmbeddingUsage

#: Inputs one request may carry (OpenAI's own limit).
MAX_INPUTS = 2048
#: Token ids travel as INT32.
MAX_TOKEN_ID = 2**31 - 1
_SHAPES = "a string, a list of strings, a list of token ids or a list of token-id lists"
#: A model's message about one of its rows: the input, the row (in a batch), the rule.
_ROW_ERROR = re.compile(r"^(?:text_input|input_ids)(?:\[(\d+)\])?: (.*)$", re.DOTALL)

#: One prompt: a text, or token ids.
Prompt = str | list[int]


def _is_token_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def _checked(item: Any, where: str) -> Prompt:
    if isinstance(item, str):
        if not item:
            raise invalid(f"{where}: must not be an empty string", "input")
        return item
    if isinstance(item, list) and not item:
        raise invalid(f"{where}: must not be an empty list of token ids", "input")
    if not _is_token_ids(item):
        raise invalid(f"{where}: must be a string or a list of token ids", "input")
    bad = next((t for t in item if not 0 <= t <= MAX_TOKEN_ID), None)
    if bad is not None:
        raise invalid(f"{where}: token id {bad} is out of range [0, 2^31)", "input")
    return list(item)


def prompts(body: EmbeddingRequest) -> list[Prompt]:
    """The body's inputs, each a text or token ids, checked; 400s name ``input``/``dimensions``."""
    if body.dimensions is not None:
        raise invalid(
            f"dimensions: the model `{body.model}` is not a Matryoshka model and answers "
            f"its full vector only; omit dimensions (got {body.dimensions!r})",
            "dimensions",
        )
    value = body.input
    if isinstance(value, str) or _is_token_ids(value):
        return [_checked(value, "input")]
    if not isinstance(value, list):
        raise invalid(f"input: required, as {_SHAPES}", "input")
    if not value:
        raise invalid("input: must not be an empty list", "input")
    if len(value) > MAX_INPUTS:
        raise invalid(f"input: at most {MAX_INPUTS} inputs per request, got {len(value)}", "input")
    items = [_checked(item, f"input[{i}]") for i, item in enumerate(value)]
    if len({isinstance(item, str) for item in items}) > 1:
        raise invalid("input: send strings or token-id lists, not both in one list", "input")
    return items


def input_error(error: OpenAIError, first: int, single: bool) -> OpenAIError:
    """A model's error about its rows, naming the body's ``input`` item instead.

    ``first`` is the index in ``input`` of the request's first row; ``single``: the body
    sent one input, named plainly ``input``.
    """
    match = _ROW_ERROR.match(error.message)
    if error.status != 400 or match is None:
        return error
    where = "input" if single else f"input[{first + int(match.group(1) or 0)}]"
    return invalid(f"{where}: {match.group(2)}", "input")


def encode(vector: npt.NDArray[np.float32], encoding_format: str) -> list[float] | str:
    """One vector as OpenAI sends it: numbers, or base64 of its little-endian float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4", copy=False).tobytes()).decode("ascii")
    values: list[float] = vector.tolist()
    return values


def embedding_response(
    model: str,
    vectors: Sequence[npt.NDArray[np.float32]],
    prompt_tokens: int,
    encoding_format: str,
) -> CreateEmbeddingResponse:
    """The answer: one entry per input, in the body's order; usage as the engine counted."""
    data = [
        Embedding(object="embedding", index=i, embedding=encode(v, encoding_format))
        for i, v in enumerate(vectors)
    ]
    usage = EmbeddingUsage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens)
    return CreateEmbeddingResponse(object="list", data=data, model=model, usage=usage)
