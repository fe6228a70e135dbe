"""Triton backend "tensorrtllm": the engine-agnostic core bound to TensorRT-LLM's LLM API.

Importing this file never imports tensorrt_llm (that happens when the model loads), so
where TensorRT-LLM is missing the load fails with a message instead of a stub crash.
"""

from tritonforge.serving.dialects import tensorrtllm
from tritonforge.triton.model import make_model

# Clients of upstream's llmapi model and genai-perf --backend tensorrtllm work unchanged.
TritonPythonModel = make_model(
    "tritonforge.engines.tensorrtllm:TensorRTLLMEngine", tensorrtllm.DIALECT
)
