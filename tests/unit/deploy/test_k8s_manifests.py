"""deploy/k8s: every manifest against the Kubernetes schemas, offline; the pieces agree.

Kinds Kubernetes defines (Deployment, Service, PersistentVolumeClaim,
HorizontalPodAutoscaler, ConfigMap) are validated with ``kubernetes-validate`` in strict
mode (unknown fields are errors, so a misspelt ``readinessProbe`` fails here). The
ServiceMonitor is a Prometheus Operator CRD that kubernetes-validate has no schema for:
it is validated against a small JSON schema of the fields used (a subset of the
operator's CRD, closed to other fields). The Kustomization is checked for structure
and, where kubectl is installed, rendered offline with ``kubectl kustomize``.
Nothing here talks to a cluster: what a scheduler, a GPU or prometheus-adapter would do
is not tested (see deploy/k8s/README.md, "What was validated, what was not").
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "k8s"
KUBERNETES_VERSION = "1.37"
SCHEMA_KINDS = {
    "Deployment",
    "Service",
    "PersistentVolumeClaim",
    "HorizontalPodAutoscaler",
    "ConfigMap",
}

_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}


def closed(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """A JSON-schema object that takes only ``properties``: a misspelt field fails."""
    schema: dict[str, Any] = {"type": "object"}
    if required:
        schema["required"] = list(required)
    return schema | {"additionalProperties": False, "properties": properties}


def custom_resource_schema(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A CRD kubernetes-validate has no schema for: the fields used, closed to others."""
    return closed(
        {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": closed({"name": {"type": "string"}, "labels": _LABELS}, ("name",)),
            "spec": spec,
        },
        ("apiVersion", "kind", "metadata", "spec"),
    )


_DURATION = {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"}
_ENDPOINT = closed(
    {
        "port": {"type": "string"},
        "path": {"type": "string", "pattern": "^/"},
        "interval": _DURATION,
        "scrapeTimeout": _DURATION,
    },
    ("port",),
)
#: The ServiceMonitor fields these manifests use (monitoring.coreos.com/v1), closed.
SERVICE_MONITOR_SCHEMA = custom_resource_schema(
    "monitoring.coreos.com/v1",
    "ServiceMonitor",
    closed(
        {
            "selector": closed({"matchLabels": _LABELS}),
            "endpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT},
        },
        ("selector", "endpoints"),
    ),
)


def documents() -> list[tuple[Path, dict[str, Any]]]:
    found = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        if path.relative_to(DEPLOY).parts[0] == "gateway":
            continue  # its own pieces, test_k8s_gateway.py (a second Deployment, CRDs)
        found += [(path, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def by_kind(kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [
        doc
        for _, doc in documents()
        if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name)
    ]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def config_data(name: str, key: str) -> Any:
    return yaml.safe_load(by_kind("ConfigMap", name)["data"][key])


def container() -> dict[str, Any]:
    [server] = by_kind("Deployment")["spec"]["template"]["spec"]["containers"]
    return server


# --- schemas -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path_doc",
    [d for d in documents() if d[1]["kind"] in SCHEMA_KINDS],
    ids=lambda d: f"{d[0].relative_to(DEPLOY)}:{d[1]['kind']}",
)
def test_manifest_matches_the_kubernetes_schema(path_doc) -> None:
    _, doc = path_doc
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_every_manifest_is_of_a_kind_that_is_checked() -> None:
    kinds = {doc["kind"] for _, doc in documents()}
    # ScaledObject (KEDA): tests/unit/deploy/test_k8s_slo_scaling.py validates it.
    assert kinds <= SCHEMA_KINDS | {"ServiceMonitor", "Kustomization", "ScaledObject"}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "ServiceMonitor"} <= kinds


def test_strict_validation_catches_a_misspelt_field() -> None:
    """The validator is really looking: a typo in a probe fails in strict mode."""
    broken = copy.deepcopy(by_kind("Deployment"))
    pod = broken["spec"]["template"]["spec"]["containers"][0]
    pod["readinesProbe"] = pod.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_service_monitor_matches_the_fields_it_uses() -> None:
    monitor = by_kind("ServiceMonitor")
    jsonschema.validate(monitor, SERVICE_MONITOR_SCHEMA)
    broken = copy.deepcopy(monitor)
    broken["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, SERVICE_MONITOR_SCHEMA)


def test_kustomize_renders_the_base_into_valid_manifests() -> None:
    """``kubectl kustomize`` (offline; skipped where kubectl is missing) builds the base,
    replaces the image placeholder, and what it renders still validates."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    rendered = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["Deployment", "HorizontalPodAutoscaler", "PersistentVolumeClaim", "Service"]
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "tritonforge-vllm:placeholder"


def test_kustomization_lists_every_base_manifest_and_nothing_else() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    base = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == base
    [image] = kustomization["images"]
    assert image["name"] == container()["image"]  # the placeholder kustomize replaces


# --- the pieces agree ---------------------------------------------------------------


def test_triton_runs_in_explicit_mode_with_models_to_load() -> None:
    server = container()
    assert server["command"] == ["tritonserver"]
    args = server["args"]
    assert "--model-control-mode=explicit" in args  # engine restarts need it
    assert any(re.fullmatch(r"--load-model=[\w.-]+", a) for a in args)
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    for name, port in ports.items():
        assert f"--{name}-port={port}" in args


def test_probes_use_tritons_health_endpoints() -> None:
    """Readiness is the served model's: /v2/health/ready stays 200 while a model is
    unloaded (tests/e2e/test_repo_generator.py measures it), so it cannot follow an
    engine restart."""
    server = container()
    loaded = [a.removeprefix("--load-model=") for a in server["args"] if "--load-model=" in a]
    readiness = server["readinessProbe"]["httpGet"]
    assert readiness["port"] == "http"
    model = re.fullmatch(r"/v2/models/([\w.-]+)/ready", readiness["path"]).group(1)
    assert model in loaded
    assert server["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    startup = server["startupProbe"]
    assert startup["httpGet"]["path"] == "/v2/health/live"
    # Liveness must not kill a replica that is still loading its engine (minutes).
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600


def test_a_crashed_or_hung_server_is_restarted_and_leaves_the_service_meanwhile() -> None:
    """What make serve's launcher does on a machine (restart a crashed tritonserver, with
    the same models), the kubelet does here: tritonserver is the container's own process
    (no shell or supervisor in between), so its crash ends the container, which Always
    restarts with the same --load-model args; the startup probe then covers the reload."""
    pod = by_kind("Deployment")["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Always"
    server = container()
    assert server["command"] == ["tritonserver"]  # its exit is the container's exit
    readiness, liveness = server["readinessProbe"], server["livenessProbe"]
    # Out of the Service within 15 s of a server that stops answering.
    assert readiness["periodSeconds"] * readiness["failureThreshold"] <= 15
    assert readiness["timeoutSeconds"] < readiness["periodSeconds"]
    # A hung server (alive, not answering) is restarted within a minute, not at once.
    assert 20 <= liveness["periodSeconds"] * liveness["failureThreshold"] <= 60
    assert liveness["timeoutSeconds"] < liveness["periodSeconds"]


def test_one_gpu_per_replica() -> None:
    resources = container()["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 1
    assert resources["requests"]["nvidia.com/gpu"] == 1  # extended resources: equal


def test_model_repository_is_mounted_read_only_from_the_claim() -> None:
    pod = by_kind("Deployment")["spec"]["template"]["spec"]
    claim = by_kind("PersistentVolumeClaim")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    [mount] = [m for m in container()["volumeMounts"] if m["name"] == "models"]
    assert mount["readOnly"] is True
    assert "--model-repository=/models/repository" in container()["args"]
    env = {e["name"]: e["value"] for e in container()["env"]}
    assert env["TRITONFORGE_MODELS"].startswith(mount["mountPath"] + "/")


def test_service_selects_the_pods_and_names_their_ports() -> None:
    service = by_kind("Service")
    pod_labels = by_kind("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["type"] == "ClusterIP"  # not exposed outside the cluster
    container_ports = {p["name"] for p in container()["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} == container_ports
    assert {p["port"] for p in service["spec"]["ports"]} == {8000, 8001, 8002}


def test_service_monitor_scrapes_the_services_metrics_port() -> None:
    monitor, service = by_kind("ServiceMonitor"), by_kind("Service")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports


def test_plain_scrape_config_keeps_the_metrics_port_and_pod_labels() -> None:
    [job] = config_data("tritonforge-prometheus-scrape", "prometheus.yml")["scrape_configs"]
    keeps = {
        tuple(r["source_labels"]): r["regex"]
        for r in job["relabel_configs"]
        if r.get("action") == "keep"
    }
    assert keeps[("__meta_kubernetes_endpoint_port_name",)] == "metrics"
    service_name = by_kind("Service")["metadata"]["labels"]["app.kubernetes.io/name"]
    assert keeps[("__meta_kubernetes_service_label_app_kubernetes_io_name",)] == service_name
    targets = {r.get("target_label") for r in job["relabel_configs"]}
    assert {"pod", "namespace"} <= targets  # what prometheus-adapter maps to resources


def test_hpa_scales_the_deployment_on_the_adapters_renamed_queue_metric() -> None:
    hpa, deployment = by_kind("HorizontalPodAutoscaler", "tritonforge"), by_kind("Deployment")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    [metric] = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    rules = config_data("tritonforge-prometheus-adapter", "config.yaml")["rules"]
    [rule] = [r for r in rules if r["name"]["as"] == metric["pods"]["metric"]["name"]]
    assert ":" not in rule["name"]["as"]
    # The rule reads the series tritonforge exports (Triton metrics module).
    series = re.match(r"([\w:]+)\{", rule["seriesQuery"]).group(1)
    assert re.fullmatch(rule["name"]["matches"], series)
    prefix, name = series.split(":")
    metrics_source = Path(__file__).resolve().parents[3] / "tritonforge" / "triton" / "metrics.py"
    assert f'"{name}"' in metrics_source.read_text() and prefix == "vllm"
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}
