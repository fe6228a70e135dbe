"""Triton backend "vllm": the project's engine-agnostic core bound to the vLLM adapter."""

from tritonforge.triton.model import make_model

TritonPythonModel = make_model("tritonforge.engines.vllm:VllmEngine")
