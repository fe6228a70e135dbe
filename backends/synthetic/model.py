"""Triton backend "synthetic": the engine-agnostic core bound to the synthetic engine."""

from tritonforge.triton.model import make_model

TritonPythonModel = make_model("tritonforge.engines.synthetic:SyntheticEngine")
