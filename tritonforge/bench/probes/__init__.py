"""Offline engine probes on one harness (:mod:`tritonforge.bench.probes.harness`).

Each is run as ``python -m tritonforge.bench.probes.<name>`` and writes
``perf/results/<name>/<UTC>/results.json``.
"""
