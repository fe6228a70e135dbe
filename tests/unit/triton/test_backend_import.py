"""Loading a backend's model.py imports no engine: Triton's auto-complete stub stays light.

Triton's Python backend runs ``auto_complete_config`` in a stub of its own before the
model's stub starts. Every backend file names its engine instead of importing it, so
that first stub never pays vLLM's (torch's) or llama.cpp's import.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BACKENDS = sorted(p.parent.name for p in (ROOT / "backends").glob("*/model.py"))
ENGINE_MODULES = ("vllm", "torch", "llama_cpp", "tensorrt_llm")

# Loads every backend file against a stand-in pb_utils, completes a config with each,
# and prints which engine modules got imported along the way.
PROBE = """
import json, runpy, sys, types

fake = types.ModuleType("triton_python_backend_utils")
fake.using_decoupled_model_transaction_policy = lambda config: True
sys.modules["triton_python_backend_utils"] = fake

class Config:
    def __init__(self):
        self.inputs, self.outputs = [], []
    def as_dict(self):
        return {"input": self.inputs, "output": self.outputs}
    def add_input(self, spec):
        self.inputs.append(spec)
    def add_output(self, spec):
        self.outputs.append(spec)
    def set_model_transaction_policy(self, policy):
        pass
    def set_max_batch_size(self, size):
        pass

engines, paths = sys.argv[1].split(","), sys.argv[2:]
report = {}
for path in paths:
    model = runpy.run_path(path)["TritonPythonModel"]
    config = model.auto_complete_config(Config())
    report[path] = {
        "engine": model.engine_name,
        "inputs": len(config.inputs),
        "imported": sorted(m for m in engines if m in sys.modules),
    }
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def report() -> dict[str, dict]:
    paths = [str(ROOT / "backends" / name / "model.py") for name in BACKENDS]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(ENGINE_MODULES), *paths],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    )
    return {Path(path).parent.name: entry for path, entry in json.loads(done.stdout).items()}


def test_every_backend_was_probed(report) -> None:
    assert set(report) == {"vllm", "vllm_embedding", "llamacpp", "synthetic", "tensorrtllm"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_auto_complete_imports_no_engine(report, backend: str) -> None:
    entry = report[backend]
    assert entry["inputs"] > 0  # the config really was completed
    assert entry["imported"] == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_named_engine_exists(report, backend: str) -> None:
    module, _, name = report[backend]["engine"].partition(":")
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    tree = ast.parse(Path(spec.origin).read_text())
    classes = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    assert name in classes, f"{module} defines no class {name}"
