"""Prometheus metrics through Triton's own metrics endpoint (``pb_utils.MetricFamily``).

Names follow vLLM's (``<prefix>:prompt_tokens_total`` …) so existing dashboards work;
the prefix is the engine's, and every series carries ``model`` and ``version`` labels.
Latencies are measured by the core for every engine alike: TTFT from arrival at the
backend to the first token, TPOT as the request's mean time per output token after the
first, e2e to the last response.

Requests that name a LoRA adapter are counted twice: in the model's series, as every
request is, and in per-adapter series (``lora_request_outcome_total``,
``lora_prompt_tokens_total``, ``lora_generation_tokens_total``) labelled
``lora="<name>"``. The model's own series keep their labels, so dashboards and alerts
written for them see no change; the adapter series tell adapters apart.
"""

from __future__ import annotations

from typing import Any

from tritonforge.engines.base import EngineStats
from tritonforge.serving.runtime import RequestRecord

TTFT_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0]
TPOT_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5]
E2E_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0]


class TritonMetrics:
    """The metric families of one model instance; methods run on the response thread."""

    def __init__(self, pb_utils: Any, prefix: str, labels: dict[str, str]) -> None:
        family = pb_utils.MetricFamily
        self._counter_kind = family.COUNTER
        # Triton invalidates a Metric whose MetricFamily is garbage-collected: keep them.
        self._families: dict[str, Any] = {}

        self._labels = labels
        self._per_adapter: dict[str, dict[str, Any]] = {}

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
        self._metric = metric
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
        if record.lora is not None:
            self._record_adapter(record.lora, record)

    def _adapter_series(self, lora: str) -> dict[str, Any]:
        """One adapter's counters, made on its first request.

        Names are bounded: the engine admits only adapters from ``multi_lora.json``.
        """
        if lora not in self._per_adapter:
            labels = {**self._labels, "lora": lora}
            counter = self._counter_kind
            series = {
                f"outcome:{outcome}": self._metric(
                    "lora_request_outcome_total",
                    counter,
                    "Finished requests by LoRA adapter and outcome",
                    labels={**labels, "outcome": outcome},
                )
                for outcome in ("finished", "cancelled", "failed")
            }
            series["prompt"] = self._metric(
                "lora_prompt_tokens_total", counter, "Prompt tokens by LoRA adapter", labels=labels
            )
            series["generation"] = self._metric(
                "lora_generation_tokens_total",
                counter,
                "Generation tokens by LoRA adapter",
                labels=labels,
            )
            self._per_adapter[lora] = series
        return self._per_adapter[lora]

    def _record_adapter(self, lora: str, record: RequestRecord) -> None:
        series = self._adapter_series(lora)
        series[f"outcome:{record.outcome}"].increment(1)
        if record.prompt_tokens:
            series["prompt"].increment(record.prompt_tokens)
        if record.generation_tokens:
            series["generation"].increment(record.generation_tokens)

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
