"""`make serve` loads the GPU configuration only where an NVIDIA GPU answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tritonforge.launch import launcher


def _model(repository: Path, name: str, requires: str | None) -> None:
    (repository / name).mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text('backend: "vllm"\n')
    if requires is not None:
        (repository / name / "requires.txt").write_text(requires)


@pytest.mark.parametrize("gpu", [True, False])
def test_a_model_that_needs_a_gpu_is_loaded_only_with_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu: bool
) -> None:
    monkeypatch.setattr(launcher, "nvidia_gpu", lambda: gpu)
    _model(tmp_path, "cpu_model", None)
    _model(tmp_path, "gpu_model", "json\nnvidia-gpu\n")
    _model(tmp_path, "missing_engine", "tritonforge_no_such_module\n")
    expected = ["cpu_model", "gpu_model"] if gpu else ["cpu_model"]
    assert launcher.available_models(tmp_path) == expected


def test_the_shipped_gpu_model_needs_a_gpu_and_vllm() -> None:
    requires = (launcher.MODEL_REPOSITORY / "vllm_model_gpu" / "requires.txt").read_text().split()
    assert requires == ["vllm", launcher.NEEDS_NVIDIA_GPU]
