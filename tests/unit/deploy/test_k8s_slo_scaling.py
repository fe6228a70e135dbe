"""deploy/k8s/slo: scaling on SLO admission's signals, offline, like the other manifests.

The HPA alternative reads the adapter's renamed series; the KEDA ScaledObject (a CRD
kubernetes-validate has no schema for) is validated against a closed JSON schema of the
fields used. That schema is this project's, written from kedacore/keda sources of v2.14 or
later (apis/keda/v1alpha1/scaledobject_types.go and scaletriggers_types.go, the generated
config/crd/bases/keda.sh_scaledobjects.yaml, the Prometheus scaler's metadata and
pkg/scalers' metric-target check; the copies read define initialCooldownPeriod, new after
v2.13.1, and carry no exact release tag): types and required keys as the CRD has them, plus
the rules KEDA applies when it admits or builds the object (named where used). Both must name
series this project exports (tritonforge/triton/admission_metrics.py) and target the
Deployment.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import jsonschema
import pytest

from tests.unit.deploy.test_k8s_manifests import (
    by_kind,
    closed,
    config_data,
    custom_resource_schema,
)

SOURCE = Path(__file__).resolve().parents[3] / "tritonforge" / "triton" / "admission_metrics.py"

#: The CRD's int32 fields carry no other bound (KEDA's webhook checks min <= max).
_INT32 = {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1}
_TRIGGER = closed(
    {
        "type": {"const": "prometheus"},  # the one scaler used; the CRD takes any string
        # Only these two for a scaler's external metric: KEDA refuses "Utilization"
        # (cpu and memory triggers only) when it builds the scaler.
        "metricType": {"enum": ["Value", "AverageValue"]},
        # The CRD: a map of strings. The Prometheus scaler requires these three and
        # parses threshold as a float; the decimal form and http(s) are this project's.
        "metadata": closed(
            {
                "serverAddress": {"type": "string", "pattern": "^https?://"},
                "query": {"type": "string"},
                "threshold": {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?$"},
            },
            ("serverAddress", "query", "threshold"),
        ),
    },
    ("type", "metadata"),
)
#: The ScaledObject fields this manifest uses (keda.sh/v1alpha1), closed.
SCALED_OBJECT_SCHEMA = custom_resource_schema(
    "keda.sh/v1alpha1",
    "ScaledObject",
    closed(
        {
            "scaleTargetRef": closed(
                {"name": {"type": "string"}, "kind": {"type": "string"}}, ("name",)
            ),
            "minReplicaCount": _INT32,
            "maxReplicaCount": _INT32,
            "pollingInterval": _INT32,
            "cooldownPeriod": _INT32,
            # The CRD allows an empty list; KEDA's admission webhook refuses it (v2.14 on).
            "triggers": {"type": "array", "minItems": 1, "items": _TRIGGER},
        },
        ("scaleTargetRef", "triggers"),
    ),
)


def exported(series: str) -> bool:
    """``vllm:<name>`` is a family admission_metrics.py makes."""
    prefix, name = series.split(":")
    return prefix == "vllm" and f"{{prefix}}:{name}" in SOURCE.read_text()


def test_scaled_object_matches_the_fields_it_uses() -> None:
    scaled = by_kind("ScaledObject")
    jsonschema.validate(scaled, SCALED_OBJECT_SCHEMA)
    broken = copy.deepcopy(scaled)
    broken["spec"]["triggers"][0]["metadata"]["treshold"] = "1"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, SCALED_OBJECT_SCHEMA)
    utilization = copy.deepcopy(scaled)
    utilization["spec"]["triggers"][0]["metricType"] = "Utilization"
    with pytest.raises(jsonschema.ValidationError, match="is not one of"):
        jsonschema.validate(utilization, SCALED_OBJECT_SCHEMA)


def test_scaled_object_targets_the_deployment_on_exported_series() -> None:
    scaled, deployment = by_kind("ScaledObject"), by_kind("Deployment")
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"]
    for trigger in scaled["spec"]["triggers"]:
        series = re.findall(r"(vllm:\w+)\{", trigger["metadata"]["query"])
        assert series and all(exported(s) for s in series), trigger


def test_slo_hpa_reads_the_adapters_admission_series() -> None:
    hpa, deployment = by_kind("HorizontalPodAutoscaler", "tritonforge-slo"), by_kind("Deployment")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    rules = {
        r["name"]["as"]: r
        for r in config_data("tritonforge-prometheus-adapter", "config.yaml")["rules"]
    }
    names = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
    assert names == {"vllm_predicted_ttft_seconds", "vllm_slo_refusals_per_second"}
    for name in names:
        rule = rules[name]
        assert ":" not in name
        series = re.match(r"([\w:]+)\{", rule["seriesQuery"]).group(1)
        assert re.fullmatch(rule["name"]["matches"], series) and exported(series)
        assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
    refusals = rules["vllm_slo_refusals_per_second"]["metricsQuery"]
    assert 'decision=~"refused_.*"' in refusals and "rate(" in refusals


def test_the_slo_alternatives_are_not_in_the_base() -> None:
    """Each replaces hpa.yaml: two autoscalers on one Deployment would fight."""
    from tests.unit.deploy.test_k8s_manifests import DEPLOY

    base = (DEPLOY / "kustomization.yaml").read_text()
    assert "slo/" not in base and not list(DEPLOY.glob("slo/kustomization.yaml"))
