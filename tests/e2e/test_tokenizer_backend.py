"""The same parity through the running `preprocessing` / `postprocessing` models.

Every corpus string goes through the real tritonserver (the session's `triton_server`)
and must come back with HF's ids; every encoding goes back through `postprocessing` and
must come back with HF's text. Bad requests must get an error naming the problem while
the models stay READY.
"""

from __future__ import annotations

import concurrent.futures
from collections import defaultdict

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tokenizers import Tokenizer as HfTokenizer
from tritonclient.utils import InferenceServerException

from tests.tokenizers_under_test import SMOLLM2

pytestmark = pytest.mark.server
ROWS = 64  # the models' max_batch_size


@pytest.fixture(scope="module")
def client(triton_server) -> grpcclient.InferenceServerClient:
    with grpcclient.InferenceServerClient(triton_server.grpc_url) as c:
        yield c


@pytest.fixture(scope="module")
def hf() -> HfTokenizer:
    return HfTokenizer.from_file(str(SMOLLM2))


def _text_input(texts: list[str] | list[bytes]) -> grpcclient.InferInput:
    data = np.array([[t.encode() if isinstance(t, str) else t] for t in texts], dtype=object)
    tensor = grpcclient.InferInput("text_input", list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data)
    return tensor


def _ids_input(rows: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("output_ids", list(rows.shape), "INT32")
    tensor.set_data_from_numpy(rows.astype(np.int32))
    return tensor


def _encode(client, model: str, texts: list[str], **parameters) -> list[list[int]]:
    result = client.infer(model, [_text_input(texts)], parameters=parameters or None)
    ids, lengths = result.as_numpy("input_ids"), result.as_numpy("input_lengths")
    return [ids[row, : lengths[row, 0]].tolist() for row in range(len(texts))]


def test_preprocessing_matches_hf_on_the_corpus(client, hf, corpus: list[str]) -> None:
    """Multi-row requests (rows of different lengths, padded) over the whole corpus."""
    expected = [e.ids for e in hf.encode_batch(corpus)]
    got: list[list[int]] = []
    for start in range(0, len(corpus), ROWS):
        got.extend(_encode(client, "preprocessing", corpus[start : start + ROWS]))
    mismatches = [(t, a, b) for t, a, b in zip(corpus, got, expected, strict=True) if a != b]
    assert not mismatches, mismatches[:3]


def test_postprocessing_matches_hf_on_the_corpus(client, hf, corpus: list[str]) -> None:
    """Encodings grouped by length, so every row of a request is exact (no padding)."""
    by_length: dict[int, list[list[int]]] = defaultdict(list)
    for encoding in hf.encode_batch(corpus):
        by_length[len(encoding.ids)].append(encoding.ids)
    for skip in (True, False):
        for rows in by_length.values():
            for start in range(0, len(rows), ROWS):
                chunk = rows[start : start + ROWS]
                result = client.infer(
                    "postprocessing",
                    [_ids_input(np.array(chunk).reshape(len(chunk), -1))],
                    parameters={"skip_special_tokens": skip},
                )
                texts = [t[0].decode() for t in result.as_numpy("text_output")]
                assert texts == hf.decode_batch(chunk, skip_special_tokens=skip)


def test_concurrent_requests_of_different_lengths_are_batched_correctly(
    client, hf, corpus: list[str]
) -> None:
    """Single-row requests sent at once: the dynamic batcher may put them in one execute."""
    texts = corpus[5000:5400]
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        got = list(pool.map(lambda t: _encode(client, "preprocessing", [t])[0], texts))
    assert got == [e.ids for e in hf.encode_batch(texts)]
    stats = client.get_inference_statistics("preprocessing", as_json=True)
    assert int(stats["model_stats"][0]["inference_count"]) >= len(texts)


def test_python_twin_gives_the_same_outputs(client, corpus: list[str]) -> None:
    texts = corpus[::40]
    for start in range(0, len(texts), ROWS):
        chunk = texts[start : start + ROWS]
        cpp = client.infer("preprocessing", [_text_input(chunk)])
        py = client.infer("preprocessing_py", [_text_input(chunk)])
        assert np.array_equal(cpp.as_numpy("input_ids"), py.as_numpy("input_ids"))
        assert np.array_equal(cpp.as_numpy("input_lengths"), py.as_numpy("input_lengths"))


def _error(client, model: str, inputs: list, **parameters) -> str:
    with pytest.raises(InferenceServerException) as info:
        client.infer(model, inputs, parameters=parameters or None)
    return info.value.message()


def test_bad_requests_get_errors_naming_the_problem(client) -> None:
    message = _error(client, "preprocessing", [_text_input(["fine", b"caf\xc3"])])
    assert "text_input[1]: text is not valid UTF-8 (invalid byte 0xC3 at byte offset 3)" in message
    message = _error(client, "postprocessing", [_ids_input(np.array([[1, 2], [3, 49152]]))])
    assert "output_ids[1][1]: token id 49152 is not in the vocabulary (size 49152)" in message
    message = _error(client, "postprocessing", [_ids_input(np.array([[-7]]))])
    assert "output_ids[0][0]: token id -7" in message
    wrong_type = grpcclient.InferInput("output_ids", [1, 2], "INT64")
    wrong_type.set_data_from_numpy(np.array([[1, 2]], dtype=np.int64))
    assert "INT64" in _error(client, "postprocessing", [wrong_type])
    message = _error(client, "preprocessing", [_text_input(["x"])], add_special_tokens="maybe")
    assert "'add_special_tokens' must be true or false, got 'maybe'" in message
    for model in ("preprocessing", "postprocessing"):
        assert client.is_model_ready(model)
    assert _encode(client, "preprocessing", ["still serving"]) != []


def test_request_parameter_overrides_skip_special_tokens(client, hf) -> None:
    ids = np.array([hf.encode("<|im_start|>user\nHi<|im_end|>").ids])
    kept = client.infer(
        "postprocessing", [_ids_input(ids)], parameters={"skip_special_tokens": False}
    )
    skipped = client.infer("postprocessing", [_ids_input(ids)])
    assert kept.as_numpy("text_output")[0, 0].decode() == "<|im_start|>user\nHi<|im_end|>"
    assert skipped.as_numpy("text_output")[0, 0].decode() == "user\nHi"
