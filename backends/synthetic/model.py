"""Triton backend "synthetic": the engine-agnostic core bound to the synthetic engine."""

from tritonforge.engines.synthetic import SyntheticEngine
from tritonforge.triton.model import make_model

TritonPythonModel = make_model(SyntheticEngine)
