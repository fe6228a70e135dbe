"""The edge's tensor cache: recurring one-element outputs are built once, shared once sent."""

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


def _sent(cache, outputs: dict[str, np.ndarray]) -> list:
    """The tensors of one response, as a response thread gets them and then sends them."""
    tensors, fresh = cache.tensors(outputs)
    cache.keep(fresh)
    return tensors


def test_a_recurring_value_is_sent_as_the_same_tensor(edge) -> None:
    cache = edge.TensorCache()
    first = _sent(cache, _outputs(b" the", 1))
    again = _sent(cache, _outputs(b" the", 1))
    other = _sent(cache, _outputs(b" a", 1))
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
        tensors, fresh = cache.tensors(outputs)
        assert fresh == [] and tensors[0] is not _sent(cache, outputs)[0]


def test_a_new_tensor_is_shared_only_after_its_first_send(edge) -> None:
    """Its first send writes its shared memory outside the GIL: nobody else may send it then."""
    cache = edge.TensorCache()
    mine, fresh = cache.tensors(_outputs(b" the", 1))
    theirs: list = []
    worker = threading.Thread(target=lambda: theirs.extend(_sent(cache, _outputs(b" the", 1))))
    worker.start()
    worker.join()
    assert theirs[0] is not mine[0] and theirs[0].array.item(0) == b" the"
    cache.keep(fresh)  # the first send returned
    later: list = []
    worker = threading.Thread(target=lambda: later.extend(_sent(cache, _outputs(b" the", 1))))
    worker.start()
    worker.join()
    assert later[0] in (mine[0], theirs[0])  # the other thread now reuses a sent one


def test_the_oldest_entries_leave_past_the_limit(edge) -> None:
    cache = edge.TensorCache(limit=4)
    built = [_sent(cache, {"num_output_tokens": np.array([n], dtype=np.uint32)}) for n in range(6)]
    assert len(cache._shared) == 4
    assert _sent(cache, {"num_output_tokens": np.array([5], dtype=np.uint32)})[0] is built[5][0]
    assert _sent(cache, {"num_output_tokens": np.array([0], dtype=np.uint32)})[0] is not built[0][0]


def test_clear_lets_go_of_every_tensor(edge) -> None:
    """finalize empties it: a tensor freed at the interpreter's exit crashes the stub."""
    cache = edge.TensorCache()
    first = _sent(cache, _outputs(b" the", 1))
    cache.clear()
    assert cache._shared == {}
    assert _sent(cache, _outputs(b" the", 1))[0] is not first[0]
