"""Benchmarks by contract: measure Triton's models against vLLM's own server and the
engine's offline ceiling on the same load, and plan KV-cache capacity.

Entry point: ``python -m tritonforge.bench {run,plan,validate,report}`` (see perf/README.md).
"""
