"""charts/jitserve: `helm lint` and `helm template` (Helm's Go SDK via helm-python-sdk) with
default values, with `global` set and with each knob, values.schema.json, the webhook's
generated certificate, the checked-in install manifest, and server-side validation of every
rendered object by the real API server (dry run)."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm  # scripts/setup-k8s.sh installs helm-python-sdk (Helm's Go SDK)
import pytest
import yaml

from jitserve.operator import builders as b
from jitserve.operator import constants as c
from jitserve.operator.kube import KubeError, RestKube
from jitserve.policy import load_policy
from scripts import render_manifests as render
from tests.support.gaie import install_inference_pool_crd
from tests.support.kube_fake import serving as serving_spec
from tests.support.operator_session import API_PATHS, ensure_namespace

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "jitserve"

CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()
MONITORING_ON = {
    "monitoring": {
        "podMonitor": {"enabled": True, "interval": "30s", "labels": {"release": "kps"}},
        "serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
        "prometheusRule": {
            "enabled": True,
            "labels": {"release": "kps"},
            "objective": 0.99,
            "burnRates": [
                {
                    "name": "Page",
                    "long": "1h",
                    "short": "5m",
                    "factor": 14.4,
                    "for": "2m",
                    "severity": "page",
                }
            ],
        },
        "dashboards": {"namespace": "monitoring", "annotations": {"grafana_folder": "LLM"}},
    }
}
# Each knob of values.yaml, and `global` (a parent chart's shared values).
VARIANTS: dict[str, dict[str, Any] | None] = {
    "defaults": None,
    "global": {"global": {"imageRegistry": "registry.example.com", "storageClass": "fast"}},
    "watch-namespaces": {"watchNamespaces": ["team-a", "team-b"]},
    "cluster-wide": {"clusterWide": True},
    "names": {"nameOverride": "llm", "fullnameOverride": "edge-llm"},
    "images": {
        "image": {"repository": "registry.example.com/jitserve/operator", "tag": "9.9.9"},
        "sidecarImage": {"repository": "registry.example.com/sidecar", "tag": "1.2.3"},
        "analyzerImage": {"repository": "registry.example.com/analyzer", "tag": "1.2.3"},
        "childImagePullPolicy": "Always",
        "imagePullSecrets": [{"name": "regcred"}],
    },
    "pod": {
        "podSecurityContext": {"runAsNonRoot": True, "runAsUser": 2000, "fsGroup": 2000},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True},
        "podLabels": {"team": "ml-platform"},
        "podAnnotations": {"example.com/owner": "sre"},
        "priorityClassName": "system-cluster-critical",
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}
                            ]
                        }
                    ]
                }
            }
        },
    },
    "webhook-own-cert": {"webhook": {"certSecret": "jitserve-tls", "caBundle": CA}},
    "webhook-cert-manager": {
        "webhook": {
            "certSecret": "jitserve-tls",
            "annotations": {"cert-manager.io/inject-ca-from": "jitserve-system/jitserve-tls"},
        }
    },
    "webhook-url": {
        "webhook": {
            "url": "https://10.0.0.7:9443/validate-slopolicy",
            "caBundle": CA,
            "failurePolicy": "Ignore",
            "namespaceSelector": {"matchLabels": {"jitserve": "on"}},
        }
    },
    "no-webhook-no-metrics": {"webhook": {"enabled": False}, "metrics": {"enabled": False}},
    "inference-pool": {"inferencePool": {"enabled": True, "policy": "chat", "namespace": "team-a",
                                         "failureMode": "FailOpen"}},
    "monitoring": MONITORING_ON,
    "keda": {"keda": {"enabled": True, "serverAddress": "http://prometheus.monitoring:9090",
                      "policies": [{"name": "chat", "namespace": "team-a", "minReplicas": 1,
                                    "maxReplicas": 8}]}},
}
# Kinds the test cluster cannot validate: the prometheus-operator's CRDs are not installed.
MONITORING_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}


def _by_kind(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        out.setdefault(doc["kind"], []).append(doc)
    return out


@pytest.mark.parametrize("values", list(VARIANTS.values()), ids=list(VARIANTS))
def test_helm_lint_passes_strict(values: dict[str, Any] | None) -> None:
    report = helm.lint(str(CHART), values, strict=True, kube_version="v1.20.2")
    errors = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    assert errors == [], errors


def test_values_schema_rejects_bad_values() -> None:
    chart = helm.Chart.load(str(CHART))
    chart.validate_schema({})
    chart.validate_schema({"global": {"anything": {"nested": [1, 2]}}})
    for bad in (
        {"statusIntervalSeconds": 0},
        {"image": {"repository": "x", "pullPolicy": "Sometimes"}},
        {"watchNamespaces": ["Not_A_Namespace"]},
        {"unknownKey": 1},
        {"global": "not-a-map"},
        {"clusterWide": "yes"},
        {"sidecarImage": "jitserve/sidecar:0.1.0"},
        {"webhook": {"enabled": True, "port": 9443, "failurePolicy": "Sometimes"}},
        {"webhook": {"enabled": True, "port": 9443, "failurePolicy": "Fail", "url": "http://x"}},
        {"monitoring": {"prometheusRule": {"enabled": True, "objective": 1.5}}},
        {"monitoring": {"podMonitor": {"enabled": True, "interval": "often"}}},
        {"inferencePool": {"enabled": True, "policy": "chat", "sidecarPort": 8080,
                           "sidecarAdminPort": 9090, "failureMode": "Sometimes",
                           "picker": {"replicas": 2, "port": 9002, "placement": "power-of-k"}}},
        {"inferencePool": {"enabled": True, "policy": "Not_A_Name", "sidecarPort": 8080,
                           "sidecarAdminPort": 9090, "failureMode": "FailOpen",
                           "picker": {"replicas": 2, "port": 9002, "placement": "power-of-k"}}},
    ):
        with pytest.raises(helm.HelmError):
            chart.validate_schema(bad)


def test_the_inference_pool_is_off_by_default_and_needs_its_policy() -> None:
    assert not [d for d in render.render_documents() if d["kind"] == "InferencePool"]
    chart = helm.Chart.load(str(CHART))
    with pytest.raises(helm.HelmError, match=r"inferencePool\.policy: name the SLOPolicy"):
        chart.render({"inferencePool": {"enabled": True}})
    docs = _by_kind(render.render_documents(VARIANTS["inference-pool"]))
    (pool,) = docs["InferencePool"]
    assert pool["metadata"]["namespace"] == "team-a"
    assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"
    # the pool selects the pods the operator labels as the policy's serving pods
    assert pool["spec"]["selector"]["matchLabels"] == b.selector_labels("chat")
    picker = next(d for d in docs["Deployment"] if d["metadata"]["name"] == "chat-picker")
    labels = picker["spec"]["template"]["metadata"]["labels"]
    # ... and its picker pods are the ones the operator's NetworkPolicy admits to the
    # sidecars' admin port (their replica reports)
    admitted = b.build_network_policy(b.PolicyRef("chat", "team-a", "u"), [])
    (selector,) = admitted["spec"]["ingress"][1]["from"]
    for rule in selector["podSelector"]["matchExpressions"]:
        assert labels[rule["key"]] in rule["values"]


def test_keda_scaled_objects_apply_the_planners_count_to_each_listed_policy() -> None:
    assert not [d for d in render.render_documents() if d["kind"] == "ScaledObject"]
    chart = helm.Chart.load(str(CHART))
    with pytest.raises(helm.HelmError, match=r"keda\.serverAddress"):
        chart.render({"keda": {"enabled": True, "policies": []}})
    with pytest.raises(helm.HelmError):
        chart.validate_schema({"keda": {"enabled": True, "serverAddress": "prometheus:9090",
                                        "pollingInterval": 15, "policies": []}})
    (scaled,) = _by_kind(render.render_documents(VARIANTS["keda"]))["ScaledObject"]
    assert scaled["metadata"] == {**scaled["metadata"], "name": "chat", "namespace": "team-a"}
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": c.API_VERSION, "kind": c.KIND,
                                      "name": "chat"}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 8)
    (trigger,) = spec["triggers"]
    # the operator's gauge, passed through: AverageValue with target 1 = the count itself
    assert trigger["metricType"] == "AverageValue" and trigger["metadata"]["threshold"] == "1"
    query = trigger["metadata"]["query"]
    assert query == ('max(jitserve_operator_autoscaler_desired_replicas'
                     '{namespace="team-a",policy="chat"})')
    from jitserve.operator.metrics import OperatorMetrics

    assert "jitserve_operator_autoscaler_desired_replicas" in [
        m.name for m in OperatorMetrics().registry.collect()]


def test_webhook_url_without_its_ca_fails_to_render() -> None:
    chart = helm.Chart.load(str(CHART))
    with pytest.raises(helm.HelmError, match=r"webhook\.url needs webhook\.caBundle"):
        chart.render({"webhook": {"url": "https://10.0.0.7:9443/validate-slopolicy"}})


def test_default_rbac_is_namespaced_cluster_wide_is_explicit() -> None:
    default = _by_kind(render.render_documents())
    assert "ClusterRole" not in default and "ClusterRoleBinding" not in default
    (role,) = default["Role"]
    assert role["metadata"]["namespace"] == render.NAMESPACE
    args = default["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--namespace={render.NAMESPACE}" in args and "--all-namespaces" not in args
    verbs = {
        (r["apiGroups"][0], res): set(r["verbs"]) for r in role["rules"] for res in r["resources"]
    }
    # Least privilege: no wildcards; Secrets only read by name and written (no list/watch).
    assert all("*" not in v for v in verbs.values())
    assert verbs[("", "secrets")] == {"get", "create", "patch"}
    assert verbs[("", "pods")] == {"list", "patch"}  # patch: the pod-deletion-cost only
    # deletes only what a spec can take away: the Ingress, the fleet's gateway
    deleters = {key for key, v in verbs.items() if "delete" in v}
    assert deleters == {("networking.k8s.io", "ingresses"), ("apps", "deployments"),
                        ("", "services")}
    assert "update" not in verbs[("apps", "deployments")]  # server-side apply: patch

    scoped = _by_kind(render.render_documents({"watchNamespaces": ["team-a", "team-b"]}))
    assert "ClusterRole" not in scoped and "ClusterRoleBinding" not in scoped
    assert sorted(r["metadata"]["namespace"] for r in scoped["Role"]) == ["team-a", "team-b"]
    args = scoped["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args

    wide = _by_kind(render.render_documents({"clusterWide": True}))
    assert "Role" not in wide and len(wide["ClusterRole"]) == 1
    args = wide["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" in args


def test_child_images_follow_the_app_version_and_the_values() -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]

    def env(values: dict[str, Any] | None) -> dict[str, str]:
        (deployment,) = _by_kind(render.render_documents(values))["Deployment"]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        return {e["name"]: e["value"] for e in container["env"] if "value" in e}

    assert env(None)["JITSERVE_SIDECAR_IMAGE"] == f"jitserve/sidecar:{app_version}"
    assert env(None)["JITSERVE_ANALYZER_IMAGE"] == f"jitserve/analyzer:{app_version}"
    images = env(VARIANTS["images"])
    assert images["JITSERVE_SIDECAR_IMAGE"] == "registry.example.com/sidecar:1.2.3"
    assert images["JITSERVE_ANALYZER_IMAGE"] == "registry.example.com/analyzer:1.2.3"


def test_names_and_pod_knobs_reach_the_objects() -> None:
    named = render.render_documents(VARIANTS["names"])
    for doc in named:
        if doc["kind"] != "CustomResourceDefinition":
            assert doc["metadata"]["name"].startswith("edge-llm"), doc["metadata"]["name"]
    (deployment,) = _by_kind(render.render_documents(VARIANTS["pod"]))["Deployment"]
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["labels"]["team"] == "ml-platform"
    assert pod["spec"]["securityContext"]["runAsUser"] == 2000
    assert pod["spec"]["priorityClassName"] == "system-cluster-critical"
    assert pod["spec"]["tolerations"][0]["key"] == "dedicated"


def test_generated_webhook_certificate_serves_the_service_name(tmp_path: Path) -> None:
    docs = _by_kind(render.render_documents())
    (secret,) = docs["Secret"]
    (config,) = docs["ValidatingWebhookConfiguration"]
    (hook,) = config["webhooks"]
    service = next(s for s in docs["Service"] if s["metadata"]["name"].endswith("-webhook"))
    assert hook["clientConfig"]["service"]["name"] == service["metadata"]["name"]
    assert hook["clientConfig"]["service"]["path"] == "/validate-slopolicy"
    assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    assert hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
    for key in ("tls.crt", "ca.crt"):
        (tmp_path / key).write_bytes(base64.b64decode(secret["data"][key]))
    host = f"{service['metadata']['name']}.{render.NAMESPACE}.svc"
    checked = subprocess.run(
        [
            "openssl",
            "verify",
            "-CAfile",
            str(tmp_path / "ca.crt"),
            "-verify_hostname",
            host,
            str(tmp_path / "tls.crt"),
        ],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # The operator mounts that Secret and serves the webhook port the Service targets.
    (deployment,) = docs["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["webhook-tls"]["secret"]["secretName"] == secret["metadata"]["name"]
    ports = {p["name"]: p["containerPort"] for p in pod["containers"][0]["ports"]}
    assert ports["webhook"] == 9443 and service["spec"]["ports"][0]["targetPort"] == "webhook"


def test_install_manifest_is_the_rendered_chart() -> None:
    assert (ROOT / "manifests" / "install.yaml").read_text() == render.install_manifest(), (
        "manifests/install.yaml is stale: run .venv/bin/python scripts/render_manifests.py"
    )


def test_monitoring_objects_select_what_the_operator_makes() -> None:
    docs = _by_kind(render.render_documents(MONITORING_ON))
    serving, analyzer = sorted(docs["PodMonitor"], key=lambda d: d["metadata"]["name"])[::-1]
    assert serving["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/managed-by": "jitserve-operator",
        "app.kubernetes.io/component": "serving",
    }
    ports = [e["port"] for e in serving["spec"]["podMetricsEndpoints"]]
    # The sidecar's admin port (metrics without a key, in no Service) and vLLM's port, by
    # the names the operator gives them in the pod.
    template = b.build_pod_template(
        b.PolicyRef("p", "ns", "u"), load_policy(serving_spec()), b.OperatorSettings()
    )
    named = {p["name"] for ct in template["spec"]["containers"] for p in ct["ports"]}
    assert ports == [c.ADMIN_PORT_NAME, "vllm"] and set(ports) <= named
    assert analyzer["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert serving["spec"]["namespaceSelector"] == {"matchNames": [render.NAMESPACE]}
    (monitor,) = docs["ServiceMonitor"]
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    (rule,) = docs["PrometheusRule"]
    alerts = [r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert alerts[0] == "JitserveSLOBurnRatePage" and "JitserveBackendDown" in alerts
    (dashboards,) = docs["ConfigMap"]
    assert dashboards["metadata"]["namespace"] == "monitoring"
    assert dashboards["metadata"]["labels"]["grafana_dashboard"] == "1"


def _dry_run(admin: RestKube, doc: dict[str, Any]) -> None:
    path = API_PATHS[(doc["apiVersion"], doc["kind"])].format(
        ns=doc["metadata"].get("namespace", "")
    )
    name = doc["metadata"]["name"]
    live = admin.request("GET", f"{path}/{name}")
    if live is None:
        admin.request("POST", path, doc, query={"dryRun": "All"})
        return
    doc = {
        **doc,
        "metadata": {**doc["metadata"], "resourceVersion": live["metadata"]["resourceVersion"]},
    }
    admin.request("PUT", f"{path}/{name}", doc, query={"dryRun": "All"})


@pytest.mark.parametrize("values", list(VARIANTS.values()), ids=list(VARIANTS))
def test_rendered_objects_pass_server_side_validation(
    admin: RestKube, values: dict[str, Any] | None
) -> None:
    """Every object the chart renders with these values is valid for the API server."""
    for ns in (render.NAMESPACE, "team-a", "team-b", "monitoring"):
        ensure_namespace(admin, ns)
    docs = render.render_documents(values)
    if any(doc["kind"] == "InferencePool" for doc in docs):
        install_inference_pool_crd(admin)  # the cluster's gateway would have installed it
    checked = 0
    for doc in docs:
        if doc["kind"] == "CustomResourceDefinition":
            continue  # created for real by the fixtures
        if doc["kind"] in MONITORING_KINDS:
            assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["spec"]
            continue
        if doc["kind"] == "ScaledObject":  # KEDA's CRD is the cluster's, not installed here
            assert doc["apiVersion"] == "keda.sh/v1alpha1" and doc["spec"]
            continue
        try:
            _dry_run(admin, doc)
        except KubeError as err:
            raise AssertionError(f"{doc['kind']} {doc['metadata']['name']}: {err}") from None
        checked += 1
    assert checked >= 5
