"""charts/jitserve: `helm lint` and `helm template` (Helm's Go SDK via helm-python-sdk),
values.schema.json, the checked-in install manifest, and server-side validation of every
rendered object by the real API server (dry run)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import helm_python as helm  # scripts/setup-k8s.sh installs helm-python-sdk (Helm's Go SDK)
import pytest
import yaml
from operator_support import API_PATHS

from jitserve.operator.kube import RestKube

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "jitserve"
sys.path.insert(0, str(ROOT / "manifests"))

import render  # noqa: E402  (manifests/render.py)


def test_helm_lint_passes_strict() -> None:
    for values in (None, {"watchNamespaces": ["team-a", "team-b"]}):
        report = helm.lint(str(CHART), values, strict=True, kube_version="v1.20.2")
        errors = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        assert errors == [], errors


def test_values_schema_rejects_bad_values() -> None:
    chart = helm.Chart.load(str(CHART))
    chart.validate_schema({})
    for bad in (
        {"statusIntervalSeconds": 0},
        {"image": {"repository": "x", "pullPolicy": "Sometimes"}},
        {"watchNamespaces": ["Not_A_Namespace"]},
        {"unknownKey": 1},
    ):
        with pytest.raises(helm.HelmError):
            chart.validate_schema(bad)


def _by_kind(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        out.setdefault(doc["kind"], []).append(doc)
    return out


def test_template_cluster_wide_and_namespaced_rbac() -> None:
    cluster = _by_kind(render.render_documents())
    assert set(cluster) == {
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
    }
    (deployment,) = cluster["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert "--all-namespaces" in pod["containers"][0]["args"]
    rules = cluster["ClusterRole"][0]["rules"]
    verbs = {(r["apiGroups"][0], res): set(r["verbs"]) for r in rules for res in r["resources"]}
    # Least privilege: no wildcards; Secrets only read by name and written (no list/watch).
    assert all("*" not in v for v in verbs.values())
    assert verbs[("", "secrets")] == {"get", "create", "update"}
    assert verbs[("", "pods")] == {"list"}
    assert "delete" not in verbs[("apps", "deployments")]

    scoped = _by_kind(render.render_documents({"watchNamespaces": ["team-a", "team-b"]}))
    assert "ClusterRole" not in scoped and "ClusterRoleBinding" not in scoped
    assert sorted(r["metadata"]["namespace"] for r in scoped["Role"]) == ["team-a", "team-b"]
    args = scoped["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args


def test_install_manifest_is_the_rendered_chart() -> None:
    assert (ROOT / "manifests" / "install.yaml").read_text() == render.install_manifest(), (
        "manifests/install.yaml is stale: run .venv/bin/python manifests/render.py"
    )


def test_rendered_objects_pass_server_side_validation(admin: RestKube) -> None:
    """Every object of install.yaml, and the namespaced variant, is valid for the API server."""
    docs = [d for d in yaml.safe_load_all((ROOT / "manifests" / "install.yaml").read_text()) if d]
    docs += [
        d
        for d in render.render_documents({"watchNamespaces": ["default"]})
        if d["kind"] in ("Role", "RoleBinding")
    ]
    namespace = next(d for d in docs if d["kind"] == "Namespace")["metadata"]["name"]
    if admin.request("GET", f"/api/v1/namespaces/{namespace}") is None:
        admin.request(
            "POST", "/api/v1/namespaces", next(d for d in docs if d["kind"] == "Namespace")
        )
    for doc in docs:
        if doc["kind"] in ("Namespace", "CustomResourceDefinition"):
            continue  # created for real by the fixtures
        path = API_PATHS[(doc["apiVersion"], doc["kind"])].format(
            ns=doc["metadata"].get("namespace", "")
        )
        name = doc["metadata"]["name"]
        method, target = (
            ("PUT", f"{path}/{name}") if admin.request("GET", f"{path}/{name}") else ("POST", path)
        )
        if method == "PUT":
            live = admin.request("GET", target) or {}
            doc = {
                **doc,
                "metadata": {
                    **doc["metadata"],
                    "resourceVersion": live["metadata"]["resourceVersion"],
                },
            }
        admin.request(method, target, doc, query={"dryRun": "All"})
