"""Every metric family tritonforge exports, found by running the code that makes them.

A model's series are made through Triton's ``pb_utils.MetricFamily``; here the same classes
(:class:`TritonMetrics`, :class:`AdmissionMetrics`) run against a recording stand-in of it,
and every lazily made series (per adapter, LoRA info, per-request token histograms) is
brought into being the way a serving model does. The launcher's series come from its own
Prometheus registry. So the reference lists what the code makes, not what a page says.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prometheus_client.metrics import MetricWrapperBase

from tritonforge.engines.base import EngineStats
from tritonforge.launch.supervisor import SupervisorMetrics
from tritonforge.triton.admission_metrics import AdmissionMetrics
from tritonforge.triton.metrics import TritonMetrics

#: The labels every model series carries.
MODEL_LABELS = {"model": "m", "version": "1"}
PREFIX = "<prefix>"


@dataclass
class MetricDoc:
    """One metric family: its name, kind, meaning and label names."""

    name: str
    kind: str
    description: str
    labels: set[str] = field(default_factory=set)
    source: str = ""


class _Recorder:
    """What the stand-in of ``pb_utils.MetricFamily`` saw, by family name."""

    def __init__(self) -> None:
        self.families: dict[str, MetricDoc] = {}

    def family_class(self, source: str) -> type:
        recorder = self

        class _Metric:
            def increment(self, value: float) -> None: ...

            def set(self, value: float) -> None: ...

            def observe(self, value: float) -> None: ...

        class _Family:
            COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

            def __init__(self, name: str, description: str, kind: str) -> None:
                self.doc = recorder.families.setdefault(
                    name, MetricDoc(name, kind, description, source=source)
                )

            def Metric(  # pb_utils names it so
                self, labels: dict[str, str] | None = None, **_: Any
            ) -> _Metric:
                self.doc.labels |= set(labels or {})
                return _Metric()

        return _Family


def model_metrics() -> list[MetricDoc]:
    """The series of one LLM model instance, admission and adapters included."""
    recorder = _Recorder()
    pb_utils = SimpleNamespace(MetricFamily=recorder.family_class("every LLM model"))
    metrics = TritonMetrics(pb_utils, PREFIX, dict(MODEL_LABELS))
    metrics.size_by_context(2048)
    metrics._adapter_series("a")  # made on an adapter's first request
    metrics.set_stats(EngineStats(running=1, kv_cache_usage=0.5, running_loras=("a",), max_lora=1))
    admission = SimpleNamespace(MetricFamily=recorder.family_class("`admission` observe or on"))
    AdmissionMetrics(admission, PREFIX, dict(MODEL_LABELS))
    return sorted(recorder.families.values(), key=lambda d: d.name)


def launcher_metrics() -> list[MetricDoc]:
    """The launcher's own series, from the collectors of its Prometheus registry."""
    docs = []
    for collector in vars(SupervisorMetrics()).values():
        if not isinstance(collector, MetricWrapperBase):
            continue
        (family,) = collector.describe()
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = set(collector._labelnames)
        docs.append(MetricDoc(name, family.type, family.documentation, labels, "launcher"))
    return sorted(docs, key=lambda d: d.name)


def metric_prefixes(engines_dir: Path) -> dict[str, str]:
    """Engine class → ``metric_prefix``, read from the adapters' source (no engine import)."""
    prefixes = {}
    for path in sorted(engines_dir.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            for item in node.body:
                if (
                    isinstance(item, ast.Assign)
                    and any(
                        isinstance(t, ast.Name) and t.id == "metric_prefix" for t in item.targets
                    )
                    and isinstance(item.value, ast.Constant)
                ):
                    prefixes[node.name] = str(item.value.value)
    return prefixes
