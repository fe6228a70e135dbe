"""The edge's tensor cache: recurring one-element outputs are built once per thread."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.fakes import edge_module


class _Tensor:
    """Stands in for pb_utils.Tensor: remembers what it was built from."""

    built = 0

    def __init__(self, name: str, array: np.ndarray) -> None:
        type(self).built += 1
        self.name, self.array = name, array


@pytest.fixture
def edge(monkeypatch: pytest.MonkeyPatch):
    """tritonforge.triton.model bound to a stand-in triton_python_backend_utils."""
    yield from edge_module(monkeypatch, Tensor=_Tensor)


def _outputs(text: bytes, count: int) -> dict[str, np.ndarray]:
    return {
        "text_output": np.array([text], dtype=np.object_),
        "num_output_tokens": np.array([count], dtype=np.uint32),
    }


def test_a_recurring_value_is_sent_as_the_same_tensor(edge) -> None:
    cache = edge.TensorCache()
    first = cache.tensors(_outputs(b" the", 1))
    again = cache.tensors(_outputs(b" the", 1))
    other = cache.tensors(_outputs(b" a", 1))
    assert [t.name for t in first] == ["text_output", "num_output_tokens"]
    assert first[0] is again[0] and first[1] is again[1]
    assert other[0] is not first[0] and other[1] is first[1]
    assert other[0].array.item(0) == b" a"


def test_values_that_rarely_recur_are_built_every_time(edge) -> None:
    cache = edge.TensorCache()
    long_text = {"text_output": np.array([b"x" * 33], dtype=np.object_)}
    logprob = {"cumulative_logprob": np.array([-1.5], dtype=np.float32)}
    ids = {"output_ids": np.array([5, 6], dtype=np.int32)}
    for outputs in (long_text, logprob, ids):
        assert cache.tensors(outputs)[0] is not cache.tensors(outputs)[0]


def test_each_thread_sends_only_tensors_it_built(edge) -> None:
    cache = edge.TensorCache()
    mine = cache.tensors(_outputs(b" the", 1))
    theirs: list = []
    worker = threading.Thread(target=lambda: theirs.extend(cache.tensors(_outputs(b" the", 1))))
    worker.start()
    worker.join()
    assert theirs[0] is not mine[0] and theirs[0].array.item(0) == b" the"


def test_the_cache_stays_within_its_limit(edge) -> None:
    cache = edge.TensorCache(limit=4)
    for count in range(10):
        cache.tensors({"num_output_tokens": np.array([count], dtype=np.uint32)})
    assert len(cache._local.cache) <= 4
    first = cache.tensors({"num_output_tokens": np.array([9], dtype=np.uint32)})
    assert first[0] is cache.tensors({"num_output_tokens": np.array([9], dtype=np.uint32)})[0]
