"""deploy/k8s/gateway: the InferencePool and its endpoint picker, offline.

Kinds Kubernetes defines are validated with ``kubernetes-validate`` in strict mode, as the
base's are (test_k8s_manifests.py); the InferencePool against this project's closed JSON
schema of the upstream v1 API at the Gateway API Inference Extension's v1.0.0
(deploy/k8s/gateway/schemas/). The OpenAI sidecar patch is merged into the base Deployment
the way a strategic-merge patch adds a container, and the result validated. Then the
pieces must agree: the pool selects the server pods on the frontend's port, names the
picker's Service, and the picker scrapes the metrics port for series tritonforge exports.
What a gateway or a cluster would do is not tested here.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.unit.deploy.test_k8s_manifests import DEPLOY, KUBERNETES_VERSION

GATEWAY = DEPLOY / "gateway"
POOL_SCHEMA = GATEWAY / "schemas" / "inferencepool-v1.0.0.schema.json"
EPP_IMAGE = "registry.k8s.io/gateway-api-inference-extension/epp:v1.0.0"
METRICS_SOURCE = DEPLOY.parents[1] / "tritonforge" / "triton" / "metrics.py"
#: The EPP flags that name the series it reads (queue, KV cache, LoRA).
METRIC_FLAGS = (
    "total-queued-requests-metric",
    "kv-cache-usage-percentage-metric",
    "lora-info-metric",
)
#: Plugin types the v1.0.0 picker registers that this configuration may use.
PLUGIN_TYPES = {
    "single-profile-handler",
    "queue-scorer",
    "kv-cache-utilization-scorer",
    "lora-affinity-scorer",
    "prefix-cache-scorer",
    "max-score-picker",
}


def load(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((GATEWAY / name).read_text()) if doc]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [doc] = [d for d in docs if d["kind"] == kind]
    return doc


def pool() -> dict[str, Any]:
    return one(load("inferencepool.yaml"), "InferencePool")


def base(kind: str) -> dict[str, Any]:
    [doc] = [
        d
        for path in ("deployment.yaml", "service.yaml")
        for d in yaml.safe_load_all((DEPLOY / path).read_text())
        if d and d["kind"] == kind
    ]
    return doc


def epp_container() -> dict[str, Any]:
    [container] = one(load("epp.yaml"), "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def epp_flags() -> dict[str, str]:
    return dict(arg.removeprefix("--").split("=", 1) for arg in epp_container()["args"])


def epp_metric_flags() -> dict[str, str]:
    """The series the picker is told to read, as its flags spell them."""
    flags = epp_flags()
    return {name: flags[name] for name in METRIC_FLAGS}


def with_sidecar() -> dict[str, Any]:
    """The base Deployment after the sidecar patch (a new container name is appended)."""
    merged = copy.deepcopy(base("Deployment"))
    [patch] = load("openai-sidecar.yaml")
    assert patch["metadata"]["name"] == merged["metadata"]["name"]
    merged["spec"]["template"]["spec"]["containers"] += patch["spec"]["template"]["spec"][
        "containers"
    ]
    return merged


def schema() -> dict[str, Any]:
    return json.loads(POOL_SCHEMA.read_text())


# --- schemas -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "doc",
    [d for d in load("epp.yaml")] + [with_sidecar()],
    ids=lambda d: f"{d['kind']}:{d['metadata']['name']}",
)
def test_kubernetes_kinds_match_the_kubernetes_schema(doc) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_inference_pool_matches_the_upstream_v1_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(schema())
    jsonschema.validate(pool(), schema())


@pytest.mark.parametrize(
    ("path", "value", "rule"),
    [
        (("spec", "targetPortNumber"), 9000, "Additional properties"),  # v1alpha2's spelling
        (("spec", "targetPorts"), [{"number": 9000}, {"number": 9001}], "too long"),
        (("spec", "targetPorts"), [{"number": 0}], "less than the minimum"),
        (("spec", "endpointPickerRef", "failureMode"), "Open", "is not one of"),
        (("spec", "endpointPickerRef", "portNumber"), 9002, "Additional properties"),
        (("spec", "selector", "matchLabels"), {"app": "-server"}, "does not match"),
        (("spec", "endpointPickerRef", "port"), {"number": 65536}, "greater than the maximum"),
        (("spec", "endpointPickerRef", "kind"), "apps/Service", "does not match"),
    ],
)
def test_the_pool_schema_rejects_what_v1_does_not_accept(path, value, rule) -> None:
    broken = copy.deepcopy(pool())
    *parents, leaf = path
    node = broken
    for key in parents:
        node = node[key]
    node[leaf] = value
    with pytest.raises(jsonschema.ValidationError, match=rule):
        jsonschema.validate(broken, schema())


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "selector", "matchLabels"), {}),  # no size bound in the v1.0.0 CRD
        (("spec", "selector", "matchLabels"), {"not a key!": "x"}),  # keys are not checked
        (("spec", "endpointPickerRef", "failureMode"), "FailOpen"),
        (("spec", "endpointPickerRef", "group"), ""),
    ],
)
def test_the_pool_schema_accepts_what_v1_0_0_accepts(path, value) -> None:
    """The schema is the v1.0.0 CRD's, not stricter: this project's own rules live in the
    tests below, so a manifest that fails here would fail on a cluster too."""
    changed = copy.deepcopy(pool())
    *parents, leaf = path
    node = changed
    for key in parents:
        node = node[key]
    node[leaf] = value
    jsonschema.validate(changed, schema())


def test_a_picker_of_another_kind_needs_no_port() -> None:
    other = copy.deepcopy(pool())
    del other["spec"]["endpointPickerRef"]["port"]
    other["spec"]["endpointPickerRef"]["kind"] = "Backend"
    jsonschema.validate(other, schema())


def test_a_service_picker_needs_its_port() -> None:
    broken = copy.deepcopy(pool())
    del broken["spec"]["endpointPickerRef"]["port"]
    with pytest.raises(jsonschema.ValidationError, match="'port' is a required property"):
        jsonschema.validate(broken, schema())


def test_the_gateway_kustomization_lists_every_manifest_and_renders() -> None:
    [kustomization] = load("kustomization.yaml")
    listed = set(kustomization["resources"])
    assert listed == {"inferencepool.yaml", "epp.yaml"}  # the sidecar is a patch, applied apart
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    out = subprocess.run(
        [kubectl, "kustomize", str(GATEWAY)], check=True, capture_output=True, text=True
    ).stdout
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(out) if d)
    expected = sorted(d["kind"] for name in listed for d in load(name))
    assert kinds == expected


# --- the pieces agree ----------------------------------------------------------------


def test_pool_selects_the_server_pods_on_the_openai_frontends_port() -> None:
    spec = pool()["spec"]
    pod = with_sidecar()["spec"]["template"]
    assert spec["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c["ports"]}
    assert [p["number"] for p in spec["targetPorts"]] == [ports["openai"]]
    [frontend] = [c for c in pod["spec"]["containers"] if c["name"] == "openai"]
    assert frontend["command"][-1] == "tritonforge.openai"
    assert f"--port={ports['openai']}" in frontend["args"]
    # Triton's gRPC port in the same pod.
    assert f"--triton-grpc=127.0.0.1:{ports['grpc']}" in frontend["args"]


#: A Kubernetes label key: an optional DNS-subdomain prefix and "/", then a name of 1-63.
LABEL_KEY = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)


def test_pool_selector_is_a_valid_non_empty_label_set() -> None:
    """The v1.0.0 CRD lets an empty selector (every pod in the namespace) or a malformed key
    through; later releases bound the map to 1-64 entries. Hold ours to that here."""
    labels = pool()["spec"]["selector"]["matchLabels"]
    assert 1 <= len(labels) <= 64
    for key in labels:
        prefix, _, _ = key.rpartition("/")
        assert LABEL_KEY.fullmatch(key) and len(prefix) <= 253, key


def test_pool_names_the_pickers_service_and_port() -> None:
    ref = pool()["spec"]["endpointPickerRef"]
    service = one(load("epp.yaml"), "Service")
    assert ref["name"] == service["metadata"]["name"]
    [grpc] = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    assert grpc["appProtocol"] == "http2"  # ext_proc is gRPC
    flags = epp_flags()
    assert int(flags["grpc-port"]) == ref["port"]["number"]
    assert flags["pool-name"] == pool()["metadata"]["name"]
    assert flags["pool-group"] == pool()["apiVersion"].split("/")[0]
    assert epp_container()["image"] == EPP_IMAGE  # the version the schema is of


def test_picker_scrapes_the_metrics_port_for_series_tritonforge_exports() -> None:
    """The pool's port is the frontend's: the picker is pointed at Triton's metrics port."""
    flags = epp_flags()
    ports = {
        p["name"]: p["containerPort"]
        for p in base("Deployment")["spec"]["template"]["spec"]["containers"][0]["ports"]
    }
    assert int(flags["model-server-metrics-port"]) == ports["metrics"]
    assert flags["model-server-metrics-path"] == "/metrics"
    source = METRICS_SOURCE.read_text()
    loaded = [
        a.removeprefix("--load-model=")
        for a in base("Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        if a.startswith("--load-model=")
    ]
    for flag, spec in epp_metric_flags().items():
        match = re.fullmatch(r'vllm:(\w+)\{model="([\w.-]+)"\}', spec)
        assert match, f"{flag}: {spec}"
        assert f'"{match.group(1)}"' in source, f"{flag}: tritonforge does not export {spec}"
        assert match.group(2) in loaded


def test_picker_config_scores_with_registered_plugins_it_declares() -> None:
    config = yaml.safe_load(one(load("epp.yaml"), "ConfigMap")["data"]["config.yaml"])
    declared = {p.get("name", p["type"]): p["type"] for p in config["plugins"]}
    assert set(declared.values()) <= PLUGIN_TYPES
    [profile] = config["schedulingProfiles"]
    refs = {r["pluginRef"] for r in profile["plugins"]}
    assert refs <= declared.keys()
    # What the README says it decides on: queue, KV cache, adapters.
    assert {"queue-scorer", "kv-cache-utilization-scorer", "lora-affinity-scorer"} <= refs
    mount = epp_container()["volumeMounts"][0]["mountPath"]
    assert epp_flags()["config-file"] == f"{mount}/config.yaml"
