"""Triton backend "llamacpp": the engine-agnostic core bound to llama.cpp (llama-cpp-python)."""

from tritonforge.triton.model import make_model

TritonPythonModel = make_model("tritonforge.engines.llamacpp:LlamaCppEngine")
