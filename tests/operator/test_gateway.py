"""The fleet's gateway (issue 18): with ``spec.replicas`` > 1 the operator adds the gateway
Deployment and Service and a headless Service of the serving pods, routes the Ingress
through the gateway, and reports each pod's readiness; with one pod nothing changes.
Pure builders, then reconcile against the in-memory API (tests/support/kube_fake.py)."""

from __future__ import annotations

from typing import Any

from jitserve.operator import builders as b
from jitserve.operator import constants as c
from jitserve.operator.reconcile import reconcile
from jitserve.operator.replica_status import pod_readiness
from jitserve.policy import SLOPolicySpec, load_policy
from tests.support.kube_fake import FakeKube, serving

REF = b.PolicyRef(name="chat", namespace="team-a", uid="1234")
SETTINGS = b.OperatorSettings(sidecar_image="jitserve/sidecar:test")
NS = REF.namespace
INGRESS = {"host": "chat.example.com"}


def spec(**wire: Any) -> SLOPolicySpec:
    return load_policy(serving(dict(wire)))


def children(s: SLOPolicySpec) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o
            for o in b.build_policy_children(REF, s, SETTINGS)}


def _flag(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_one_pod_has_no_gateway_and_the_ingress_goes_to_the_pods() -> None:
    objs = children(spec(replicas=1, ingress=INGRESS))
    assert ("Deployment", "chat-gateway") not in objs
    assert ("Service", "chat-gateway") not in objs and ("Service", "chat-replicas") not in objs
    backend = objs[("Ingress", "chat")]["spec"]["rules"][0]["http"]["paths"][0]["backend"]
    assert backend["service"]["name"] == "chat"


def test_three_pods_get_the_gateway_in_front_and_the_ingress_goes_through_it() -> None:
    s = spec(replicas=3, ingress=INGRESS, sidecar={"port": 8081, "adminPort": 9091})
    objs = children(s)
    gateway = objs[("Deployment", "chat-gateway")]
    assert gateway["spec"]["replicas"] == 2
    container = gateway["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "jitserve/sidecar:test" and container["args"][0] == "gateway"
    # the gateway finds the pods as the headless Service's A records, at the sidecars' ports
    assert _flag(container["args"], "--discover") == "chat-replicas.team-a.svc:8081:9091"
    assert _flag(container["args"], "--placement") == "power-of-k"
    assert _flag(container["args"], "--config") == f"{c.CONFIG_DIR}/{c.CONFIG_KEY}"
    config = gateway["spec"]["template"]["spec"]["volumes"][0]
    assert config["configMap"]["name"] == "chat-config"
    pod_labels = gateway["spec"]["template"]["metadata"]["labels"]
    assert gateway["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()

    headless = objs[("Service", "chat-replicas")]["spec"]
    assert headless["clusterIP"] == "None"
    assert headless["selector"] == b.selector_labels("chat")  # the serving pods
    assert [p["port"] for p in headless["ports"]] == [8081]  # the admin port in no Service

    front = objs[("Service", "chat-gateway")]["spec"]
    assert front["selector"] == gateway["spec"]["selector"]["matchLabels"]
    assert front["ports"][0]["targetPort"] == "http"
    assert {"name": "http", "containerPort": c.GATEWAY_PORT, "protocol": "TCP"} in (
        container["ports"])

    backend = objs[("Ingress", "chat")]["spec"]["rules"][0]["http"]["paths"][0]["backend"]
    assert backend["service"] == {"name": "chat-gateway", "port": {"name": "http"}}
    # the pods' own Service stays (in-cluster clients that address one pod's API)
    assert objs[("Service", "chat")]["spec"]["selector"] == b.selector_labels("chat")
    # every gateway child is owned by the policy, as the others are
    for key in (("Deployment", "chat-gateway"), ("Service", "chat-gateway"),
                ("Service", "chat-replicas")):
        assert objs[key]["metadata"]["ownerReferences"] == [REF.owner_reference()]
    # the gateway reads the pods' replica reports on their admin port
    rules = objs[("NetworkPolicy", "chat")]["spec"]["ingress"]
    admin_from = [r["from"] for r in rules
                  if r.get("ports") == [{"protocol": "TCP", "port": c.ADMIN_PORT_NAME}]]
    (selector,) = admin_from[0]
    expressions = selector["podSelector"]["matchExpressions"]
    assert {"key": c.LABEL_COMPONENT, "operator": "In", "values": ["gateway", "picker"]} in (
        expressions)
    assert {"key": c.LABEL_POLICY, "operator": "In", "values": ["chat"]} in expressions
    assert pod_labels[c.LABEL_COMPONENT] == "gateway" and pod_labels[c.LABEL_POLICY] == "chat"


def test_the_gateway_children_do_not_change_with_scheduler_tuning() -> None:
    base = children(spec(replicas=3))
    tuned = children(spec(replicas=3, scheduler={"cutoff": {"mode": "fixed", "value": 0.5}}))
    for key in (("Deployment", "chat-gateway"), ("Service", "chat-gateway"),
                ("Service", "chat-replicas")):
        assert base[key] == tuned[key]


def policy(kube: FakeKube, replicas: int, **wire: Any) -> None:
    kube.add({"apiVersion": c.API_VERSION, "kind": c.KIND,
              "metadata": {"name": "chat", "namespace": NS},
              "spec": serving({"replicas": replicas, **wire})})


def fresh(kube: FakeKube) -> dict[str, Any]:
    body = kube.get(c.API_VERSION, c.KIND, NS, "chat")
    assert body is not None
    return body


def set_replicas(kube: FakeKube, replicas: int) -> None:
    kube.objects[(c.API_VERSION, c.KIND, NS, "chat")]["spec"]["replicas"] = replicas


GATEWAY_KEYS = [("apps/v1", "Deployment", NS, "chat-gateway"),
                ("v1", "Service", NS, "chat-gateway"),
                ("v1", "Service", NS, "chat-replicas")]


def test_reconcile_creates_the_gateway_puts_it_back_and_removes_it_at_one_pod() -> None:
    kube = FakeKube()
    policy(kube, 3, ingress=INGRESS)
    out = reconcile(kube, fresh(kube), SETTINGS)
    for key in GATEWAY_KEYS:
        assert key in kube.objects, key
        assert f"create {key[1]} {NS}/{key[3]}" in out.writes
    ingress = kube.objects[("networking.k8s.io/v1", "Ingress", NS, "chat")]
    assert ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"] == (
        "chat-gateway")
    assert reconcile(kube, fresh(kube), SETTINGS).writes == []  # nothing changed

    del kube.objects[GATEWAY_KEYS[0]]  # deleted by hand: put back
    assert reconcile(kube, fresh(kube), SETTINGS).writes == [
        f"create Deployment {NS}/chat-gateway"]

    set_replicas(kube, 1)
    out = reconcile(kube, fresh(kube), SETTINGS)
    for key in GATEWAY_KEYS:
        assert key not in kube.objects, key
        assert f"delete {key[1]} {NS}/{key[3]}" in out.writes
    ingress = kube.objects[("networking.k8s.io/v1", "Ingress", NS, "chat")]
    assert ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"] == "chat"


def test_a_same_named_object_the_policy_does_not_control_is_left_alone() -> None:
    kube = FakeKube()
    policy(kube, 1)
    kube.add({"apiVersion": "v1", "kind": "Service",
              "metadata": {"name": "chat-gateway", "namespace": NS}, "spec": {"ports": []}})
    out = reconcile(kube, fresh(kube), SETTINGS)
    assert ("v1", "Service", NS, "chat-gateway") in kube.objects
    assert not any("chat-gateway" in w for w in out.writes)


def _pod(name: str, ready: bool, **status: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": b.selector_labels("chat")},
            "status": {"phase": "Running", "podIP": f"10.0.1.{len(name)}",
                       "conditions": [{"type": "Ready", "status": str(ready),
                                       "reason": None if ready else "ContainersNotReady"}],
                       **status}}


def test_status_reports_each_replica_and_the_gateway() -> None:
    kube = FakeKube()
    policy(kube, 3)
    kube.add(_pod("chat-a", True))
    kube.add(_pod("chat-b", False, containerStatuses=[
        {"name": "vllm", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]))
    kube.add(_pod("chat-c", False))
    reconcile(kube, fresh(kube), SETTINGS)
    status = fresh(kube)["status"]
    assert status["replicaStatus"] == [
        {"name": "chat-a", "ready": True, "podIP": "10.0.1.6"},
        {"name": "chat-b", "ready": False, "reason": "vllm: CrashLoopBackOff",
         "podIP": "10.0.1.6"},
        {"name": "chat-c", "ready": False, "reason": "ContainersNotReady", "podIP": "10.0.1.6"},
    ]
    assert status["gateway"] == {"replicas": 2, "readyReplicas": 0}
    # the serving Deployment is rolled out, the gateway is not: not Ready, and why
    for name in ("chat", "chat-gateway"):
        kube.objects[("apps/v1", "Deployment", NS, name)]["status"] = {
            "readyReplicas": 3 if name == "chat" else 0, "updatedReplicas": 3,
            "availableReplicas": 3, "observedGeneration": 99}
    reconcile(kube, fresh(kube), SETTINGS)
    ready = next(x for x in fresh(kube)["status"]["conditions"] if x["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "WaitingForGateway")
    assert "gateway 0/2 ready" in ready["message"]
    kube.objects[("apps/v1", "Deployment", NS, "chat-gateway")]["status"]["readyReplicas"] = 1
    reconcile(kube, fresh(kube), SETTINGS)
    status = fresh(kube)["status"]
    ready = next(x for x in status["conditions"] if x["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Available")
    assert status["gateway"] == {"replicas": 2, "readyReplicas": 1}


def test_one_pod_reports_no_gateway_and_a_terminating_pod_is_not_ready() -> None:
    kube = FakeKube()
    policy(kube, 1)
    pod = _pod("chat-a", True)
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    kube.add(pod)
    reconcile(kube, fresh(kube), SETTINGS)
    status = fresh(kube)["status"]
    assert "gateway" not in status
    assert status["replicaStatus"] == [{"name": "chat-a", "ready": False,
                                        "reason": "Terminating", "podIP": "10.0.1.6"}]
    assert pod_readiness({"metadata": {"name": "p"}}).reason == "Unknown"
