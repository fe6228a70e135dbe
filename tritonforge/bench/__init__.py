"""Benchmarks by contract: measure Triton's models against vLLM's own server and the
engine's offline ceiling on the same load, and plan KV-cache capacity.

Entry point: ``python -m tritonforge.bench {run,validate,plan,report,ceiling,ab,overload,
overload-report,soak,storm}``; offline probes: ``tritonforge.bench.probes`` (see
docs/benchmarking.md).
"""
