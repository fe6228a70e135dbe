"""Prometheus metrics through Triton's own metrics endpoint (``pb_utils.MetricFamily``).

Names follow vLLM's (``<prefix>:prompt_tokens_total`` …) so existing dashboards work;
the prefix is the engine's, and every series carries ``model`` and ``version`` labels.
Latencies are measured by the core for every engine alike: TTFT from arrival at the
backend to the first token, e2e to the last response.

The families vllm_backend exports keep its semantics and buckets, so its dashboards and
tests read the same numbers here: ``time_per_output_token_seconds`` gets one sample per
output token after the first (not one per request; written as its ``_bucket``, ``_sum``
and ``_count`` counters, see :class:`CounterHistogram`), and ``request_prompt_tokens``,
``request_generation_tokens`` (buckets 1, 2, 5, 10, … up to the model's context) and
``request_params_n`` are histograms of finished requests. This project's own families
stand beside them: ``mean_time_per_output_token_seconds`` is one sample per request (its
mean after the first token), the figure an SLO on a request's TPOT is judged by.

Requests that name a LoRA adapter are counted twice: in the model's series, as every
request is, and in per-adapter series (``lora_request_outcome_total``,
``lora_prompt_tokens_total``, ``lora_generation_tokens_total``) labelled
``lora="<name>"``. The model's own series keep their labels, so dashboards and alerts
written for them see no change; the adapter series tell adapters apart.

``<prefix>:lora_requests_info`` is the gauge the Gateway API Inference Extension's endpoint
picker reads for LoRA affinity, in vLLM's form: one series whose labels
``running_lora_adapters`` and ``waiting_lora_adapters`` (comma-separated names) and
``max_lora`` carry the state, and whose value is the time it was last set: the picker
takes the newest series, so a former label set (Triton 2.51 keeps its series) is ignored.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Sequence
from typing import Any

from tritonforge.engines.base import EngineStats
from tritonforge.serving.runtime import RequestRecord

TTFT_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0]
#: vllm_backend's buckets for its per-token histogram.
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
#: This project's per-request mean, finer at the low end where CPU decode steps fall.
MEAN_TPOT_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5]
#: vllm_backend's buckets for the ``n`` request parameter.
N_BUCKETS = [1, 2, 5, 10, 20]
E2E_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0]
#: Seconds between refreshes of the LoRA info gauge's timestamp while its labels hold.
LORA_INFO_REFRESH_S = 1.0


def one_two_five_buckets(limit: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, … up to ``limit`` (vllm_backend's token-count buckets)."""
    buckets: list[float] = []
    scale = 1
    while True:
        for step in (1, 2, 5):
            value = step * scale
            if value > limit:
                return buckets
            buckets.append(float(value))
        scale *= 10


class CounterHistogram:
    """A Prometheus histogram written as its series: ``<name>_bucket{le}`` (cumulative),
    ``<name>_sum`` and ``<name>_count``, each a counter family.

    A ``pb_utils`` observation is an IPC round trip to tritonserver (~40 µs measured
    here), so one per output token would cost a long request's response thread tens of
    milliseconds at its end. Written as counters, a request's samples cost one increment
    per bucket they reach: the same series a scraper and ``histogram_quantile`` read.
    """

    def __init__(
        self, metrics: TritonMetrics, name: str, description: str, buckets: list[float]
    ) -> None:
        counter = metrics._family.COUNTER
        self._bounds = list(buckets)
        self._buckets = [
            metrics._metric(
                f"{name}_bucket",
                counter,
                f"{description} (cumulative bucket counts)",
                labels={**metrics._labels, "le": _le(bound)},
            )
            for bound in [*self._bounds, float("inf")]
        ]
        self._sum = metrics._metric(f"{name}_sum", counter, f"{description} (sum of samples)")
        self._count = metrics._metric(f"{name}_count", counter, f"{description} (samples)")

    def observe_many(self, values: Sequence[float]) -> None:
        if not values:
            return
        ordered = sorted(values)
        for bound, bucket in zip(self._bounds, self._buckets, strict=False):
            if within := bisect.bisect_right(ordered, bound):
                bucket.increment(within)
        self._buckets[-1].increment(len(ordered))
        self._sum.increment(float(sum(ordered)))
        self._count.increment(len(ordered))


def _le(bound: float) -> str:
    """A bucket's ``le`` label as Prometheus clients write it."""
    return "+Inf" if bound == float("inf") else repr(float(bound))


class TritonMetrics:
    """The metric families of one model instance; methods run on a response thread.

    The runtime calls them under one lock: the lazily made per-adapter series are not
    thread-safe.
    """

    def __init__(self, pb_utils: Any, prefix: str, labels: dict[str, str]) -> None:
        self._family = pb_utils.MetricFamily
        self._prefix = prefix
        # Triton invalidates a Metric whose MetricFamily is garbage-collected: keep them.
        self._families: dict[str, Any] = {}
        self._labels = labels
        self._per_adapter: dict[str, dict[str, Any]] = {}
        counter, gauge = self._family.COUNTER, self._family.GAUGE
        self.prompt_tokens = self._metric("prompt_tokens_total", counter, "Prompt tokens processed")
        self.generation_tokens = self._metric(
            "generation_tokens_total", counter, "Generation tokens produced"
        )
        self.requests = self._outcome_counters(
            "request_outcome_total", "Finished requests by outcome", labels
        )
        self._latency_histograms()
        self.running = self._metric("num_requests_running", gauge, "Requests the engine is running")
        self.waiting = self._metric("num_requests_waiting", gauge, "Requests waiting in the engine")
        self.kv_usage = self._metric("kv_cache_usage_perc", gauge, "KV-cache usage (1 = full)")
        self._lora_info: Any = None
        self._lora_info_labels: dict[str, str] = {}
        self._lora_info_set_at = 0.0
        #: What each gauge was last set to: a set is an IPC round trip to tritonserver
        #: that holds the stub's GIL until it is answered, so unchanged values stay unsent.
        self._gauge_values: dict[str, float] = {}
        self.engine_restarts = self._metric(
            "engine_restarts_total",
            counter,
            "Times the engine died and the model restarted it (this server's life)",
        )

    def _metric(self, name: str, kind: Any, description: str, **kwargs: Any) -> Any:
        """A Metric of the family ``<prefix>:<name>`` (made once), with the model's labels."""
        full = f"{self._prefix}:{name}"
        if full not in self._families:
            self._families[full] = self._family(name=full, description=description, kind=kind)
        kwargs.setdefault("labels", self._labels)
        return self._families[full].Metric(**kwargs)

    def _outcome_counters(
        self, name: str, description: str, labels: dict[str, str]
    ) -> dict[str, Any]:
        """One counter per way a request ends, labelled ``outcome``."""
        return {
            outcome: self._metric(
                name, self._family.COUNTER, description, labels={**labels, "outcome": outcome}
            )
            for outcome in ("finished", "cancelled", "failed")
        }

    def _latency_histograms(self) -> None:
        histogram = self._family.HISTOGRAM
        self.ttft = self._metric(
            "time_to_first_token_seconds", histogram, "Time to first token", buckets=TTFT_BUCKETS
        )
        self.tpot = CounterHistogram(
            self,
            "time_per_output_token_seconds",
            "Time per output token after the first (one sample per token)",
            TPOT_BUCKETS,
        )
        self.mean_tpot = self._metric(
            "mean_time_per_output_token_seconds",
            histogram,
            "Mean time per output token after the first, per request",
            buckets=MEAN_TPOT_BUCKETS,
        )
        self.e2e = self._metric(
            "e2e_request_latency_seconds",
            histogram,
            "End-to-end request latency",
            buckets=E2E_BUCKETS,
        )
        self.n = self._metric(
            "request_params_n", histogram, "The n request parameter", buckets=N_BUCKETS
        )
        # Sized by the model's context, known once the engine started (see size_by_context).
        self.request_prompt_tokens: Any = None
        self.request_generation_tokens: Any = None

    def size_by_context(self, max_context: int) -> None:
        """The per-request token histograms, bucketed 1, 2, 5, 10, … up to ``max_context``.

        Called once the engine has started: the context is the engine's to say.
        """
        buckets = one_two_five_buckets(max_context)
        histogram = self._family.HISTOGRAM
        self.request_prompt_tokens = self._metric(
            "request_prompt_tokens", histogram, "Prompt tokens per request", buckets=buckets
        )
        self.request_generation_tokens = self._metric(
            "request_generation_tokens",
            histogram,
            "Generation tokens per request",
            buckets=buckets,
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
        self.tpot.observe_many(record.token_gaps_s)
        if record.tpot_s is not None:
            self.mean_tpot.observe(record.tpot_s)
        if record.outcome == "finished":
            self.e2e.observe(record.e2e_s)
            self.n.observe(record.n)
            if self.request_prompt_tokens is not None:
                self.request_prompt_tokens.observe(record.prompt_tokens)
                self.request_generation_tokens.observe(record.generation_tokens)
        if record.lora is not None:
            self._record_adapter(record.lora, record)

    def _adapter_series(self, lora: str) -> dict[str, Any]:
        """One adapter's counters, made on its first request.

        Names are bounded: the engine admits only adapters from ``multi_lora.json``.
        """
        if lora not in self._per_adapter:
            labels = {**self._labels, "lora": lora}
            counter = self._family.COUNTER
            by_outcome = self._outcome_counters(
                "lora_request_outcome_total",
                "Finished requests by LoRA adapter and outcome",
                labels,
            )
            series = {f"outcome:{outcome}": metric for outcome, metric in by_outcome.items()}
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
        """The engine's gauges, every poll of the runtime; only values that changed.

        Under load the polls' sets took about a tenth of the stub's GIL time (a py-spy of
        256 paced streams), every one of them waiting for tritonserver's answer.
        """
        self._set_gauge("running", self.running, stats.running)
        self._set_gauge("waiting", self.waiting, stats.waiting)
        if stats.kv_cache_usage is not None:
            self._set_gauge("kv_usage", self.kv_usage, round(stats.kv_cache_usage, 4))
        self._set_lora_info(stats)

    def _set_gauge(self, name: str, gauge: Any, value: float) -> None:
        if self._gauge_values.get(name) != value:
            gauge.set(value)
            self._gauge_values[name] = value

    def _set_lora_info(self, stats: EngineStats) -> None:
        """The picker's LoRA gauge: labels say which adapters run and wait, value when.

        The value (a Unix time) is refreshed with every change of the labels and at
        least every LORA_INFO_REFRESH_S while they stay the same.
        """
        labels = {
            **self._labels,
            "running_lora_adapters": ",".join(stats.running_loras),
            "waiting_lora_adapters": ",".join(stats.waiting_loras),
            "max_lora": str(stats.max_lora),
        }
        if labels != self._lora_info_labels:
            self._lora_info = None  # the former label set stops being updated
            self._lora_info = self._metric(
                "lora_requests_info",
                self._family.GAUGE,
                "Running and waiting LoRA adapters (labels); value: when last set (Unix s)",
                labels=labels,
            )
            self._lora_info_labels = labels
            self._lora_info_set_at = 0.0
        now = time.time()
        if now - self._lora_info_set_at >= LORA_INFO_REFRESH_S:
            self._lora_info.set(now)
            self._lora_info_set_at = now
