"""Prometheus metrics through Triton's own metrics endpoint (``pb_utils.MetricFamily``).

Names follow vLLM's (``<prefix>:prompt_tokens_total`` …) so existing dashboards work;
the prefix is the engine's, and every series carries ``model`` and ``version`` labels.
Latencies are measured by the core for every engine alike: TTFT from arrival at the
backend to the first token, TPOT as the request's mean time per output token after the
first, e2e to the last response.
"""

from __future__ import annotations

from typing import Any

from tritonforge.engines.base import EngineStats
from tritonforge.runtime import RequestRecord

TTFT_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0]
TPOT_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5]
E2E_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0]


class TritonMetrics:
    """The metric families of one model instance; methods run on the response thread."""

    def __init__(self, pb_utils: Any, prefix: str, labels: dict[str, str]) -> None:
        family = pb_utils.MetricFamily
        # Triton invalidates a Metric whose MetricFamily is garbage-collected: keep them.
        self._families: dict[str, Any] = {}

        def metric(name: str, kind: Any, description: str, **kwargs: Any) -> Any:
            full = f"{prefix}:{name}"
            if full not in self._families:
                self._families[full] = family(name=full, description=description, kind=kind)
            kwargs.setdefault("labels", labels)
            return self._families[full].Metric(**kwargs)

        self.prompt_tokens = metric(
            "prompt_tokens_total", family.COUNTER, "Prompt tokens processed"
        )
        self.generation_tokens = metric(
            "generation_tokens_total", family.COUNTER, "Generation tokens produced"
        )
        self.requests = {
            outcome: metric(
                "request_outcome_total",
                family.COUNTER,
                "Finished requests by outcome",
                labels={**labels, "outcome": outcome},
            )
            for outcome in ("finished", "cancelled", "failed")
        }
        self.ttft = metric(
            "time_to_first_token_seconds",
            family.HISTOGRAM,
            "Time to first token",
            buckets=TTFT_BUCKETS,
        )
        self.tpot = metric(
            "time_per_output_token_seconds",
            family.HISTOGRAM,
            "Mean time per output token after the first, per request",
            buckets=TPOT_BUCKETS,
        )
        self.e2e = metric(
            "e2e_request_latency_seconds",
            family.HISTOGRAM,
            "End-to-end request latency",
            buckets=E2E_BUCKETS,
        )
        self.running = metric(
            "num_requests_running", family.GAUGE, "Requests the engine is running"
        )
        self.waiting = metric(
            "num_requests_waiting", family.GAUGE, "Requests waiting in the engine"
        )
        self.kv_usage = metric("kv_cache_usage_perc", family.GAUGE, "KV-cache usage (1 = full)")
        self.engine_restarts = metric(
            "engine_restarts_total",
            family.COUNTER,
            "Times the engine died and the model restarted it (this server's life)",
        )

    def count_restarts(self, count: int) -> None:
        if count:
            self.engine_restarts.increment(count)

    def record(self, record: RequestRecord) -> None:
        if record.prompt_tokens:
            self.prompt_tokens.increment(record.prompt_tokens)
        if record.generation_tokens:
            self.generation_tokens.increment(record.generation_tokens)
        self.requests[record.outcome].increment(1)
        if record.ttft_s is not None:
            self.ttft.observe(record.ttft_s)
        if record.tpot_s is not None:
            self.tpot.observe(record.tpot_s)
        if record.outcome == "finished":
            self.e2e.observe(record.e2e_s)

    def close(self) -> None:
        """Release every Metric, then its family, while the stub can still reach Triton.

        Left to interpreter shutdown, a MetricFamily is destroyed after the stub's shared
        memory is gone and the stub segfaults on its way out (python backend 24.10).
        Triton 2.51 workaround W5, see docs/triton-2.51-workarounds.md.
        """
        for name in list(vars(self)):
            if name != "_families":
                delattr(self, name)
        self._families.clear()

    def set_stats(self, stats: EngineStats) -> None:
        self.running.set(stats.running)
        self.waiting.set(stats.waiting)
        if stats.kv_cache_usage is not None:
            self.kv_usage.set(stats.kv_cache_usage)
