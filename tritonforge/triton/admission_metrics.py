"""SLO admission's Prometheus series, for autoscalers and dashboards.

Only models whose ``admission`` parameter is ``observe`` or ``on`` have them:

* ``<prefix>:admission_decisions_total{decision}`` — admitted, no_slo (admitted, nothing
  to judge), refused_ttft, refused_tpot: a rising refusal rate is the signal to scale out;
* ``<prefix>:ttft_prediction_error_ratio`` — histogram of |predicted - actual| / actual
  TTFT of admitted requests: how far the predictor (and so the refusals) can be trusted;
* ``<prefix>:predicted_ttft_seconds`` — the TTFT a typical request arriving now would be
  predicted (``admission_typical_prompt_tokens``): a queue measured in seconds, which an
  HPA can hold below a target whatever the engine's speed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tritonforge.engines.base import Engine
from tritonforge.serving.admission import (
    DECISIONS,
    Admission,
    AdmissionSettings,
    AdmissionSnapshot,
)

#: |predicted - actual| / actual TTFT buckets (0.2: within 20 %), 0.05 apart around 0.2 so
#: a median near the overload contract's 20 % lands on one side of it.
TTFT_ERROR_BUCKETS = [0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0]


class AdmissionMetrics:
    """The admission series of one model instance; ``export`` runs on a response thread."""

    def __init__(self, pb_utils: Any, prefix: str, labels: dict[str, str]) -> None:
        family = pb_utils.MetricFamily
        # Triton invalidates a Metric whose MetricFamily is garbage-collected: keep them.
        self._families = {
            "decisions": family(
                name=f"{prefix}:admission_decisions_total",
                description="Requests by SLO admission's decision (admitted, no_slo, refused_*)",
                kind=family.COUNTER,
            ),
            "error": family(
                name=f"{prefix}:ttft_prediction_error_ratio",
                description="|predicted - actual| / actual time to first token, admitted requests",
                kind=family.HISTOGRAM,
            ),
            "predicted": family(
                name=f"{prefix}:predicted_ttft_seconds",
                description="Predicted time to first token of a typical request arriving now",
                kind=family.GAUGE,
            ),
        }
        self._decisions = {
            d: self._families["decisions"].Metric(labels={**labels, "decision": d})
            for d in DECISIONS
        }
        self._counted = dict.fromkeys(DECISIONS, 0)
        self._error = self._families["error"].Metric(labels=labels, buckets=TTFT_ERROR_BUCKETS)
        self._predicted = self._families["predicted"].Metric(labels=labels)

    def export(self, snapshot: AdmissionSnapshot) -> None:
        """Counters up to the snapshot's totals, its new errors, the gauge."""
        for decision, total in snapshot.decisions.items():
            if total > self._counted[decision]:
                self._decisions[decision].increment(total - self._counted[decision])
                self._counted[decision] = total
        for error in snapshot.ttft_errors:
            self._error.observe(error)
        if snapshot.typical_ttft_s is not None:
            self._predicted.set(snapshot.typical_ttft_s)

    def close(self) -> None:
        """Release every Metric, then its family, while the stub can still reach Triton.

        Triton 2.51 workaround W5 (as TritonMetrics.close), see
        docs/triton-2.51-workarounds.md.
        """
        self._decisions.clear()
        del self._error, self._predicted
        self._families.clear()


def model_admission(
    pb_utils: Any, engine: Engine, parameters: Mapping[str, str], labels: dict[str, str]
) -> tuple[Admission | None, AdmissionMetrics | None]:
    """The model's admission and its metrics, from config.pbtxt (None, None when off)."""
    settings = AdmissionSettings.from_parameters(parameters)
    if settings.mode == "off":
        return None, None
    metrics = AdmissionMetrics(pb_utils, engine.metric_prefix, labels)
    admission = Admission(
        settings,
        engine_running=lambda: engine.stats().running,
        exporter=metrics.export,
        capacity=lambda: engine.max_running,
    )
    return admission, metrics
