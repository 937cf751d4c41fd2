"""A fleet on the real API server (1.20.2, scripts/setup-k8s.sh), with kubectl:

- the Inference Extension's InferencePool CRD (crds/gaie/) applies, and so do the chart's
  InferencePool of a policy's pods, its endpoint picker's Deployment and Services
  (``inferencePool.enabled=true``); the API server keeps the pool as the CRD's schema says
  (its defaults filled, a pool without target ports refused);
- the session's ``jitserve operator`` puts a gateway (Deployment of 2, its Service, a
  headless Service of the serving pods) in front of a policy with 3 replicas, routes the
  Ingress through it, puts a deleted gateway back, reports each pod's readiness and waits
  for a gateway pod before Ready, and removes the gateway when the policy goes back to one
  pod.

No kubelet runs: the test marks pods Running and Ready the way a kubelet would
(``mark_pods_running``)."""

from __future__ import annotations

import json
from typing import Any

import yaml

from jitserve.operator import builders as b
from jitserve.operator import constants as c
from jitserve.operator.cli import api_server_has_cel
from jitserve.operator.kube import RestKube
from tests.support import gaie
from tests.support.http import MODEL
from tests.support.operator_session import (
    SESSION_NAMESPACES,
    Kubectl,
    SessionOperator,
    chart_objects,
    ensure_namespace,
    gateway_pod_selector,
    mark_pods_running,
    wait_for,
)

NS = SESSION_NAMESPACES[8]  # the session operator's "fleet" namespace


def _ok(result: Any) -> str:
    said = str(result.stdout + result.stderr)
    assert result.returncode == 0, said
    return said


def test_the_inference_pool_crd_and_the_charts_pool_and_picker_apply(
    admin: RestKube, kubectl: Kubectl
) -> None:
    crd_args = ["apply", "-f", "crds/gaie/"]
    if not api_server_has_cel(admin):
        crd_args.insert(1, "--validate=false")  # kubectl 1.20 refuses the CEL rules
    assert f"customresourcedefinition.apiextensions.k8s.io/{gaie.CRD_NAME}" in _ok(
        kubectl(*crd_args))
    gaie.wait_established(admin)

    ensure_namespace(admin, NS)
    values = {"inferencePool": {"enabled": True, "policy": "pooled", "namespace": NS}}
    docs = [d for d in chart_objects(values)
            if d["metadata"].get("labels", {}).get(c.LABEL_COMPONENT) == "picker"]
    assert sorted(d["kind"] for d in docs) == ["Deployment", "InferencePool", "Service",
                                                "Service"]
    said = _ok(kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs)))
    assert "inferencepool.inference.networking.k8s.io/pooled created" in said
    assert "deployment.apps/pooled-picker created" in said

    pool = json.loads(_ok(kubectl("get", "inferencepool", "pooled", "-n", NS, "-o", "json")))
    spec = pool["spec"]
    assert spec["selector"]["matchLabels"] == b.selector_labels("pooled")
    assert spec["targetPorts"] == [{"number": 8080}]  # the sidecar's API port
    ref = spec["endpointPickerRef"]
    assert (ref["name"], ref["port"], ref["failureMode"]) == (
        "pooled-picker", {"number": 9002}, "FailClose")
    # the CRD's schema is live: its defaults are filled in by the API server
    assert spec["appProtocol"] == "http" and ref["group"] == ""
    rows = _ok(kubectl("get", "infpool", "-n", NS)).splitlines()
    assert rows[0].split()[0] == "NAME" and rows[1].split()[0] == "pooled"

    picker = admin.get("apps/v1", "Deployment", NS, "pooled-picker")
    assert picker is not None
    args = picker["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "picker"
    assert f"--discover=pooled-picker-endpoints.{NS}.svc:8080:9090" in args
    service = admin.get("v1", "Service", NS, "pooled-picker")
    assert service is not None and service["spec"]["ports"][0]["port"] == 9002
    assert service["spec"]["selector"] == picker["spec"]["selector"]["matchLabels"]
    endpoints = admin.get("v1", "Service", NS, "pooled-picker-endpoints")
    assert endpoints is not None and endpoints["spec"]["clusterIP"] == "None"

    bad = {**docs[[d["kind"] for d in docs].index("InferencePool")]}
    bad = {**bad, "metadata": {**bad["metadata"], "name": "no-ports"},
           "spec": {**bad["spec"], "targetPorts": []}}
    refused = kubectl("apply", "--validate=false", "-f", "-", stdin=yaml.safe_dump(bad))
    assert refused.returncode != 0 and "targetPorts" in refused.stderr, refused.stderr


def _status(admin: RestKube, name: str) -> dict[str, Any]:
    body = admin.get(c.API_VERSION, c.KIND, NS, name) or {}
    found: dict[str, Any] = body.get("status") or {}
    return found


def _ready(status: dict[str, Any]) -> dict[str, Any]:
    return next((x for x in status.get("conditions", []) if x["type"] == "Ready"), {})


def _backend(admin: RestKube, name: str) -> str:
    """The Service the Ingress routes to; "" while the Ingress is not there yet."""
    ingress = admin.get("networking.k8s.io/v1", "Ingress", NS, name)
    if ingress is None:
        return ""
    rules = ingress["spec"]["rules"]
    return str(rules[0]["http"]["paths"][0]["backend"]["service"]["name"])


def test_three_replicas_get_the_gateway_and_one_does_not(
    admin: RestKube, session_operator: SessionOperator, kubectl: Kubectl
) -> None:
    name = "fleet"
    gateway, headless = f"{name}-gateway", f"{name}-replicas"
    doc = {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": name},
           "spec": {"model": {"name": MODEL}, "replicas": 3,
                    "ingress": {"host": "fleet.example.com"}}}
    _ok(kubectl("apply", "-n", NS, "-f", "-", stdin=yaml.safe_dump(doc)))
    uid = admin.get(c.API_VERSION, c.KIND, NS, name)["metadata"]["uid"]

    deployment = wait_for("the gateway Deployment",
                          lambda: admin.get("apps/v1", "Deployment", NS, gateway), 120)
    assert deployment["spec"]["replicas"] == 2
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:1] == ["gateway"]
    assert args[args.index("--discover") + 1] == f"{headless}.{NS}.svc:8080:9090"
    assert args[args.index("--placement") + 1] == "power-of-k"
    front = wait_for("the gateway Service", lambda: admin.get("v1", "Service", NS, gateway))
    assert front["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    pods = wait_for("the headless Service", lambda: admin.get("v1", "Service", NS, headless))
    assert pods["spec"]["clusterIP"] == "None"
    assert pods["spec"]["selector"] == b.selector_labels(name)
    for obj in (deployment, front, pods):
        owners = obj["metadata"]["ownerReferences"]
        assert [(o["uid"], o.get("controller")) for o in owners] == [(uid, True)]
    assert wait_for("the Ingress through the gateway",
                    lambda: _backend(admin, name) == gateway, 120)

    # each serving pod in status, none ready yet (no kubelet); then "the kubelet" runs them
    listed = wait_for("three pods in status.replicaStatus",
                      lambda: (lambda r: r if len(r) == 3 else None)(
                          _status(admin, name).get("replicaStatus", [])), 120)
    assert all(not r["ready"] and r["reason"] for r in listed), listed
    assert mark_pods_running(admin, NS, name) == 3
    wait_for("every replica ready in status",
             lambda: all(r["ready"] for r in _status(admin, name).get("replicaStatus", [])
                         ) and len(_status(admin, name)["replicaStatus"]) == 3, 120)
    waiting = wait_for("Ready waits for the gateway",
                       lambda: (lambda r: r if r.get("reason") == "WaitingForGateway" else None)(
                           _ready(_status(admin, name))), 120)
    assert waiting["status"] == "False" and "gateway 0/2 ready" in waiting["message"]
    gateway_pods = gateway_pod_selector(name)
    wait_for("the gateway's pods", lambda: len(admin.list("v1", "Pod", NS, gateway_pods)) == 2,
             120)
    assert mark_pods_running(admin, NS, name, selector=gateway_pods) == 2
    # Ready once one gateway pod is (it serves); the second is counted by a later status
    wait_for("Ready with the gateway up",
             lambda: _ready(_status(admin, name)).get("status") == "True", 120)
    wait_for("both gateway pods ready in status", lambda: _status(admin, name).get(
        "gateway") == {"replicas": 2, "readyReplicas": 2}, 120)

    # a deleted gateway is a child's drift: put back
    _ok(kubectl("delete", "deployment", gateway, "-n", NS))
    wait_for("the gateway put back",
             lambda: (admin.get("apps/v1", "Deployment", NS, gateway) or {}).get(
                 "metadata", {}).get("uid") not in (None, deployment["metadata"]["uid"]), 120)

    # back to one pod: no gateway, the Ingress to the pods' Service
    _ok(kubectl("patch", "slop", name, "-n", NS, "--type", "merge",
                "-p", '{"spec":{"replicas":1}}'))
    for kind, api, child in (("Deployment", "apps/v1", gateway), ("Service", "v1", gateway),
                             ("Service", "v1", headless)):
        wait_for(f"the {kind} {child} removed",
                 lambda a=api, k=kind, n=child: admin.get(a, k, NS, n) is None, 120)
    assert wait_for("the Ingress to the pods", lambda: _backend(admin, name) == name, 120)
    wait_for("no gateway in status", lambda: "gateway" not in _status(admin, name), 120)
    _ok(kubectl("delete", "slopolicy", name, "-n", NS))
