"""Server-side counters around each level: where a request's time goes inside a server.

Both servers export Prometheus text: Triton its ``nv_inference_*`` counters (queue,
compute input/infer/output per model) and whatever the backend adds, vLLM's server its
``vllm:*`` histograms (queue, prefill, decode, TTFT as the engine sees it). The delta of
each counter over one level, divided by the request count delta, gives per-request
times that can be set against the client's TTFT: the gap is the serving path's cost.
"""

from __future__ import annotations

import re

PREFIXES = ("nv_inference_", "vllm:", "tritonforge_")
SUFFIXES = ("_total", "_sum", "_count", "_us")
COUNTERS = {
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
}
GAUGE_HINTS = ("pending", "running", "waiting", "usage", "perc")
LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)")
MODEL_LABEL = re.compile(r'model(?:_name)?="([^"]*)"')


def parse(text: str, model: str | None = None) -> dict[str, float]:
    """Cumulative series summed over labels; series of other models are left out."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = LINE.match(line)
        if not match:
            continue
        name, labels, value = match.groups()
        if not name.startswith(PREFIXES) or any(h in name for h in GAUGE_HINTS):
            continue
        if not (name.endswith(SUFFIXES) or name in COUNTERS):
            continue
        if model and labels and (found := MODEL_LABEL.search(labels)) and found.group(1) != model:
            continue
        try:
            totals[name] = totals.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return totals


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What one level added; series that did not move are dropped."""
    moved = {}
    for name, value in after.items():
        change = value - before.get(name, 0.0)
        if change:
            moved[name] = change
    return moved


def per_request_ms(moved: dict[str, float]) -> dict[str, float]:
    """Mean time per request for the breakdown table, in ms, from sum/count pairs."""
    out: dict[str, float] = {}
    requests = moved.get("nv_inference_request_success") or moved.get("nv_inference_count")
    for name, value in moved.items():
        if name.startswith("nv_inference_") and name.endswith("_duration_us") and requests:
            out[name.removeprefix("nv_inference_").removesuffix("_duration_us")] = (
                value / 1e3 / requests
            )
        if name.startswith("vllm:") and name.endswith("_seconds_sum"):
            count = moved.get(name.removesuffix("_sum") + "_count")
            if count:
                out[name.removeprefix("vllm:").removesuffix("_seconds_sum")] = value * 1e3 / count
    return out
