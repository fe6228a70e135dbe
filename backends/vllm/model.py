"""Triton backend "vllm": the project's engine-agnostic core bound to the vLLM adapter."""

from tritonforge.engines.vllm import VllmEngine
from tritonforge.triton.model import make_model

TritonPythonModel = make_model(VllmEngine)
