"""Triton backend "vllm_embedding": vLLM's pooling runner behind the embedding edge."""

from tritonforge.triton.embedding import make_embedding_model

TritonPythonModel = make_embedding_model("tritonforge.engines.vllm_embedding:VllmEmbedder")
