"""Triton backend "vllm_embedding": vLLM's pooling runner behind the embedding edge."""

from tritonforge.engines.vllm_embedding import VllmEmbedder
from tritonforge.triton.embedding import make_embedding_model

TritonPythonModel = make_embedding_model(VllmEmbedder)
