"""/v1/embeddings translation: the body's input → prompts, vectors → OpenAI's answer."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from tritonforge.openai.embeddings import (
    MAX_INPUTS,
    embedding_response,
    encode,
    input_error,
    prompts,
)
from tritonforge.openai.errors import OpenAIError, from_triton, unavailable
from tritonforge.openai.protocol import EmbeddingRequest
from tritonforge.openai.responses import CreateEmbeddingResponse, to_json
from tritonforge.openai.translate import ModelSpec
from tritonforge.openai.triton_client import embedding_inputs


def body(**fields: object) -> EmbeddingRequest:
    return EmbeddingRequest.model_validate({"model": "emb", **fields})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("hello", ["hello"]),
        (["a", "b c"], ["a", "b c"]),
        ([1, 2, 3], [[1, 2, 3]]),
        ([[1, 2], [3]], [[1, 2], [3]]),
    ],
    ids=["string", "strings", "token-ids", "token-id-lists"],
)
def test_every_openai_input_shape_becomes_prompts(value: object, expected: list) -> None:
    assert prompts(body(input=value)) == expected


def rejected(**fields: object) -> OpenAIError:
    with pytest.raises(OpenAIError) as caught:
        prompts(body(**fields))
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "input: must not be an empty string"),
        ([], "input: must not be an empty list"),
        (["ok", ""], "input[1]: must not be an empty string"),
        ([[1], []], "input[1]: must not be an empty list of token ids"),
        (None, "input: required, as a string, a list of strings"),
        (7, "input: required"),
        ([{"text": "x"}], "input[0]: must be a string or a list of token ids"),
        ([True, False], "input[0]: must be a string or a list of token ids"),
        ([-1, 5], "input: token id -1 is out of range"),
        (["a", [1, 2]], "input: send strings or token-id lists, not both"),
        (["x"] * (MAX_INPUTS + 1), f"input: at most {MAX_INPUTS} inputs per request"),
    ],
    ids=[
        "empty-string",
        "empty-list",
        "empty-item",
        "empty-token-list",
        "missing",
        "number",
        "object-item",
        "booleans",
        "negative-id",
        "mixed",
        "too-many",
    ],
)
def test_bad_input_is_a_400_naming_input(value: object, message: str) -> None:
    error = rejected(input=value)
    assert error.message.startswith(message), error.message
    assert error.param == "input"


def test_dimensions_is_refused_naming_the_field() -> None:
    error = rejected(input="hi", dimensions=64)
    assert error.param == "dimensions"
    assert error.message.startswith("dimensions: ") and "Matryoshka" in error.message


def test_unknown_encoding_format_is_refused() -> None:
    with pytest.raises(ValueError, match="encoding_format"):
        body(input="hi", encoding_format="int8")


def test_base64_is_the_little_endian_float32_bytes_of_the_vector() -> None:
    vector = np.array([0.5, -1.25, 3.0e-8], dtype=np.float32)
    decoded = np.frombuffer(base64.b64decode(encode(vector, "base64")), dtype="<f4")
    assert decoded.tolist() == vector.tolist()
    assert encode(vector, "float") == vector.tolist()


def test_the_answer_is_one_entry_per_input_in_order_with_usage() -> None:
    vectors = [np.full(4, i, dtype=np.float32) for i in range(3)]
    answer = embedding_response("emb", vectors, 17, "float")
    wire = json.loads(to_json(answer))
    assert wire["object"] == "list" and wire["model"] == "emb"
    assert [d["index"] for d in wire["data"]] == [0, 1, 2]
    assert all(d["object"] == "embedding" for d in wire["data"])
    assert wire["data"][2]["embedding"] == [2.0] * 4
    assert wire["usage"] == {"prompt_tokens": 17, "total_tokens": 17}
    CreateEmbeddingResponse.model_validate(wire)  # the wire contract, keys and all


def test_a_models_row_error_names_the_bodys_input_item() -> None:
    row = from_triton("text_input[2]: prompt is 3000 tokens; the model embeds at most 2048", "m")
    assert row.status == 400
    moved = input_error(row, first=64, single=False)
    assert moved.message == "input[66]: prompt is 3000 tokens; the model embeds at most 2048"
    assert moved.param == "input"
    whole = from_triton("input_ids: token id 99999 is out of range [0, 49152)", "m")
    assert input_error(whole, first=0, single=True).message.startswith("input: token id 99999")
    busy = unavailable("busy")
    assert input_error(busy, first=3, single=False) is busy


def test_texts_go_as_rows_and_token_ids_as_one_row() -> None:
    [texts] = embedding_inputs(["a", "bé"])
    assert (texts.name(), texts.shape(), texts.datatype()) == ("text_input", [2, 1], "BYTES")
    [ids] = embedding_inputs([[5, 6, 7]])
    assert (ids.name(), ids.shape(), ids.datatype()) == ("input_ids", [1, 3], "INT32")


def test_an_embedding_model_is_told_from_an_llm_model() -> None:
    embedding = ModelSpec(
        "emb", frozenset({"text_input", "input_ids"}), frozenset({"embedding"}), 64
    )
    llm = ModelSpec(
        "llm", frozenset({"text_input", "sampling_parameters"}), frozenset({"text_output"})
    )
    assert embedding.is_embedding and not embedding.is_llm
    assert llm.is_llm and not llm.is_embedding
