"""The operator against a real API server (etcd + kube-apiserver + kube-controller-manager).

Runs unchanged against any cluster: set JITSERVE_E2E_KUBECONFIG (see k8s_cluster.py).
The operator under test is the real ``jitserve operator`` CLI in a child process, using
the chart's ServiceAccount and RBAC. No kubelet runs here: where a test needs running or
ready pods it patches the pods' status itself, as a kubelet would, and says so.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import start_http_server

from jitserve.operator import builders as b
from jitserve.operator import constants as c
from jitserve.operator.kube import KubeError, RestKube
from jitserve.operator.reconcile import APPLIED_HASH, is_subset
from jitserve.operator.routing import policy_url
from jitserve.policy import load_policy
from tests.support.kube_fake import serving
from tests.support.operator_session import (
    MEASURED,
    OTHER_NAMESPACES,
    SESSION_NAMESPACES,
    OperatorProcess,
    ensure_namespace,
    gateway_pod_selector,
    mark_pods_running,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
NS_EX, NS_TUNE, NS_INVALID, NS_DELETE, NS_METRICS, NS_DRIFT = SESSION_NAMESPACES[:6]
SETTINGS = b.OperatorSettings(sidecar_image="jitserve/sidecar:e2e")


def policy(name: str, namespace: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": serving(spec),
    }


def get_policy(kube: RestKube, ns: str, name: str) -> dict[str, Any]:
    body = kube.get(c.API_VERSION, c.KIND, ns, name)
    assert body is not None, f"{ns}/{name} is gone"
    return body


def children(kube: RestKube, ns: str, name: str) -> dict[str, dict[str, Any] | None]:
    return {
        "ConfigMap": kube.get("v1", "ConfigMap", ns, b.config_map_name(name)),
        "Secret": kube.get("v1", "Secret", ns, b.api_keys_secret_name(name)),
        "Service": kube.get("v1", "Service", ns, name),
        "Deployment": kube.get("apps/v1", "Deployment", ns, name),
        "Ingress": kube.get("networking.k8s.io/v1", "Ingress", ns, name),
        "NetworkPolicy": kube.get("networking.k8s.io/v1", "NetworkPolicy", ns, name),
        "PersistentVolumeClaim": kube.get("v1", "PersistentVolumeClaim", ns, f"{name}-model-cache"),
    }


def analyzer(kube: RestKube, ns: str) -> dict[str, dict[str, Any] | None]:
    return {
        "Deployment": kube.get("apps/v1", "Deployment", ns, c.ANALYZER_NAME),
        "Service": kube.get("v1", "Service", ns, c.ANALYZER_NAME),
        "PersistentVolumeClaim": kube.get("v1", "PersistentVolumeClaim", ns, c.ANALYZER_NAME),
    }


def condition(body: dict[str, Any], kind: str) -> dict[str, Any]:
    for cond in (body.get("status") or {}).get("conditions") or []:
        if cond["type"] == kind:
            return dict(cond)
    return {}


def wait_children(
    kube: RestKube, ns: str, name: str, ingress: bool, cache: bool = False
) -> dict[str, Any]:
    def present() -> dict[str, Any] | None:
        found = children(kube, ns, name)
        if not ingress:
            found.pop("Ingress")
        if not cache:
            found.pop("PersistentVolumeClaim")
        return found if all(found.values()) else None

    found: dict[str, Any] = wait_for(
        f"children of {ns}/{name}", present, timeout_s=60, every_s=0.05
    )
    return found


def replica_sets(kube: RestKube, ns: str, name: str) -> list[dict[str, Any]]:
    result = (
        kube.request(
            "GET",
            f"/apis/apps/v1/namespaces/{ns}/replicasets",
            query={"labelSelector": b.selector_string(name)},
        )
        or {}
    )
    return list(result.get("items") or [])


def merge_patch_policy(kube: RestKube, ns: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
    return kube.merge_patch(c.API_VERSION, c.KIND, ns, name, patch)


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_creates_expected_children_then_progressing_then_ready(
    admin: RestKube, session_operator: OperatorProcess, example: Path
) -> None:
    doc = yaml.safe_load(example.read_text())
    name = doc["metadata"]["name"]
    doc["metadata"]["namespace"] = NS_EX
    # The tenants' API-key Secrets exist first, as a user would make them.
    tenants = doc["spec"].get("fairness", {}).get("tenants", [])
    for tenant in tenants:
        admin.request(
            "POST",
            f"/api/v1/namespaces/{NS_EX}/secrets",
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": tenant["apiKeySecret"]},
                "stringData": {"api-key": f"key-of-{tenant['name']}"},
            },
        )
    start = time.monotonic()
    created = admin.create(doc)
    has_ingress = "ingress" in doc["spec"]
    has_cache = "cache" in doc["spec"]["model"]
    found = wait_children(admin, NS_EX, name, has_ingress, has_cache)
    MEASURED[f"reconcile_latency_s[{name}] (apply -> children created)"] = time.monotonic() - start

    # Children have the expected spec: what the pure builders make from this spec.
    ref = b.PolicyRef(name, NS_EX, created["metadata"]["uid"])
    spec = load_policy(created["spec"])
    for want in b.build_policy_children(ref, spec, SETTINGS):
        meta = want["metadata"]
        live = wait_for(f"{want['kind']} {meta['name']}", lambda w=want, m=meta: admin.get(
            w["apiVersion"], w["kind"], NS_EX, m["name"]))
        assert is_subset(want, live), f"{want['kind']} {meta['name']} differs from the builder's"
    assert found["Deployment"]["spec"]["replicas"] == doc["spec"]["replicas"]
    import base64

    keys = {k: base64.b64decode(v).decode() for k, v in (found["Secret"].get("data") or {}).items()}
    assert keys == {t["apiKeySecret"]: f"key-of-{t['name']}" for t in tenants}
    assert wait_for("the namespace analyzer", lambda: all(analyzer(admin, NS_EX).values()))

    progressing = wait_for(
        "Progressing=True",
        lambda: condition(get_policy(admin, NS_EX, name), "Progressing").get("status") == "True",
    )
    assert progressing
    body = get_policy(admin, NS_EX, name)
    assert condition(body, "Ready")["status"] == "False"
    assert body["status"]["selector"] == b.selector_string(name)
    assert body["status"]["url"] == policy_url(ref, spec)  # the URL column's source

    # The controller-manager made the pods (Pending, no kubelet); play kubelet: Ready.
    wait_for(
        "pods from the ReplicaSet",
        lambda: (
            len(admin.list("v1", "Pod", NS_EX, b.selector_string(name))) == doc["spec"]["replicas"]
        ),
    )
    mark_pods_running(admin, NS_EX, name)
    if b.uses_gateway(doc["spec"]["replicas"]):  # a fleet is Ready once its gateway is
        gateway_pods = gateway_pod_selector(name)
        wait_for("the gateway's pods", lambda: len(
            admin.list("v1", "Pod", NS_EX, gateway_pods)) == c.GATEWAY_REPLICAS)
        mark_pods_running(admin, NS_EX, name, selector=gateway_pods)
    ready = wait_for(
        "Ready=True",
        lambda: condition(get_policy(admin, NS_EX, name), "Ready").get("status") == "True",
        timeout_s=60,
    )
    assert ready
    body = get_policy(admin, NS_EX, name)
    assert body["status"]["readyReplicas"] == doc["spec"]["replicas"]
    assert condition(body, "Progressing")["status"] == "False"
    assert body["status"]["observedGeneration"] == body["metadata"]["generation"]
    assert condition(body, "Degraded")["status"] == "False", condition(body, "Degraded")
    # what `kubectl describe slop` shows: an Event per condition change, Ready=True last
    seen = wait_for("the Ready=True Event", lambda: [
        e for e in (admin.request(
            "GET", f"/api/v1/namespaces/{NS_EX}/events",
            query={"fieldSelector": f"involvedObject.name={name}"}) or {}).get("items", [])
        if e["involvedObject"]["kind"] == c.KIND and e["reason"] == "Available"])
    assert seen[0]["type"] == "Normal" and "Ready=True" in seen[0]["message"]
    assert seen[0]["source"]["component"] == "jitserve-operator"


def test_printer_columns_and_short_name(admin: RestKube, session_operator: OperatorProcess) -> None:
    admin.create(
        policy(
            "columns",
            NS_EX,
            {"scheduler": {"cutoff": {"value": 0.7}}, "fairness": {"weight": 0.2}, "replicas": 0},
        )
    )
    ready = wait_for("a Ready condition", lambda: condition(
        get_policy(admin, NS_EX, "columns"), "Ready").get("reason"))
    table = (
        admin.request(
            "GET",
            f"/apis/{c.API_VERSION}/namespaces/{NS_EX}/{c.PLURAL}/columns",
            accept="application/json;as=Table;v=v1;g=meta.k8s.io",
        )
        or {}
    )
    names = [col["name"] for col in table["columnDefinitions"]]
    row = dict(zip(names, table["rows"][0]["cells"], strict=True))
    assert row["P"] == 0.7 and row["F"] == 0.2 and row["Replicas"] == 0
    assert row["Reason"] and row["Reason"] in (ready, "ScaledToZero")  # it may move on
    assert row["URL"] == f"http://columns.{NS_EX}.svc.cluster.local"
    for column in ("Ready", "Attainment", "Age"):
        assert column in names
    resources = admin.request("GET", f"/apis/{c.API_VERSION}") or {}
    slop = next(r for r in resources["resources"] if r["name"] == c.PLURAL)
    assert slop["shortNames"] == ["slop"]


def test_tuning_p_and_f_changes_only_the_config_map_and_model_changes_roll(
    admin: RestKube, session_operator: OperatorProcess
) -> None:
    name = "tune"
    admin.create(policy(name, NS_TUNE, {"scheduler": {"cutoff": {"mode": "fixed", "value": 0.9}}}))
    found = wait_children(admin, NS_TUNE, name, ingress=False)
    wait_for("one ReplicaSet", lambda: len(replica_sets(admin, NS_TUNE, name)) == 1)
    (rs,) = replica_sets(admin, NS_TUNE, name)
    hash_before = rs["metadata"]["labels"]["pod-template-hash"]
    deployment_before = found["Deployment"]

    merge_patch_policy(
        admin,
        NS_TUNE,
        name,
        {
            "spec": {
                "scheduler": {"cutoff": {"value": 0.5}},
                "fairness": {"weight": 0.6, "tenants": [{"name": "gold", "weight": 4}]},
                "sloDefaults": {"latency": {"ttftSeconds": 1.0}},
            }
        },
    )

    def config() -> dict[str, Any] | None:
        cm = admin.get("v1", "ConfigMap", NS_TUNE, b.config_map_name(name)) or {}
        loaded = yaml.safe_load((cm.get("data") or {}).get(c.CONFIG_KEY, "{}"))
        return loaded if loaded["scheduler"]["cutoff"]["value"] == 0.5 else None

    loaded = wait_for("the ConfigMap to carry p=0.5", config)
    assert loaded["fairness"]["weight"] == 0.6
    assert loaded["fairness"]["tenants"] == [{"name": "gold", "weight": 4.0}]
    assert loaded["sloDefaults"]["latency"]["ttftSeconds"] == 1.0
    time.sleep(2.5)  # two status intervals: time for any (wrong) Deployment write to show
    deployment_after = admin.get("apps/v1", "Deployment", NS_TUNE, name)
    assert deployment_after is not None
    assert deployment_after["metadata"]["generation"] == deployment_before["metadata"]["generation"]
    assert deployment_after["spec"]["template"] == deployment_before["spec"]["template"]
    assert [
        r["metadata"]["labels"]["pod-template-hash"] for r in replica_sets(admin, NS_TUNE, name)
    ] == [hash_before]

    # The model image is part of the pod template: that change rolls the pods.
    merge_patch_policy(
        admin, NS_TUNE, name, {"spec": {"model": {"image": "vllm/vllm-openai:v0.12.0"}}}
    )
    wait_for("a second ReplicaSet (rollout)", lambda: len(replica_sets(admin, NS_TUNE, name)) == 2)
    hashes = {
        r["metadata"]["labels"]["pod-template-hash"] for r in replica_sets(admin, NS_TUNE, name)
    }
    assert hash_before in hashes and len(hashes) == 2

    # The scale subresource drives spec.replicas and so the Deployment.
    admin.request(
        "PATCH",
        f"/apis/{c.API_VERSION}/namespaces/{NS_TUNE}/{c.PLURAL}/{name}/scale",
        {"spec": {"replicas": 3}},
        "application/merge-patch+json",
    )
    wait_for(
        "the Deployment scaled to 3",
        lambda: (admin.get("apps/v1", "Deployment", NS_TUNE, name) or {})["spec"]["replicas"] == 3,
    )
    scale = admin.request(
        "GET", f"/apis/{c.API_VERSION}/namespaces/{NS_TUNE}/{c.PLURAL}/{name}/scale"
    )
    assert scale is not None and scale["status"]["selector"] == b.selector_string(name)


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        (
            {"scheduler": {"cutoff": {"value": 3}}},
            "spec.scheduler.cutoff.value",
            "less than or equal to 1",
        ),
        ({"scheduler": {"cutoff": {"value": 0}}}, "spec.scheduler.cutoff.value", "greater than 0"),
        ({"fairness": {"weight": -0.1}}, "spec.fairness.weight", "greater than or equal to 0"),
        (
            {"sloDefaults": {"latency": {"ttftSeconds": -1}}},
            "spec.sloDefaults.latency.ttftSeconds",
            "greater than 0",
        ),
        (
            {"admission": {"overloadAction": "explode"}},
            "spec.admission.overloadAction",
            "Unsupported value",
        ),
        (
            {"fairness": {"tenants": [{"name": "a"}, {"name": "a"}]}},
            "spec.fairness.tenants[1]",
            "Duplicate",
        ),
        ({"model": {"cpu": "lots"}}, "spec.model.cpu", "should match"),
    ],
    ids=["p=3", "p=0", "f<0", "ttft<0", "overload-action", "duplicate-tenant", "bad-quantity"],
)
def test_invalid_spec_rejected_by_the_api_server_naming_the_field(
    admin: RestKube, spec: dict[str, Any], field: str, words: str
) -> None:
    ensure_namespace(admin, NS_INVALID)
    with pytest.raises(KubeError) as caught:
        admin.create(policy("bad", NS_INVALID, spec))
    assert caught.value.status == 422
    assert field in caught.value.message and words in caught.value.message, caught.value.message


def test_cross_field_rule_reported_as_degraded_naming_the_field(
    admin: RestKube, session_operator: OperatorProcess
) -> None:
    admin.create(policy("tls", NS_INVALID, {"ingress": {"tlsSecret": "cert"}}))
    degraded = wait_for(
        "Degraded=True",
        lambda: (lambda d: d if d.get("status") == "True" else None)(
            condition(get_policy(admin, NS_INVALID, "tls"), "Degraded")
        ),
    )
    assert degraded["reason"] == "InvalidSpec"
    assert "spec.ingress.tlsSecret" in degraded["message"]
    assert all(v is None for v in children(admin, NS_INVALID, "tls").values())


def test_deleting_policies_removes_children_and_the_last_one_the_analyzer(
    admin: RestKube, session_operator: OperatorProcess
) -> None:
    for name in ("first", "second"):
        admin.create(policy(name, NS_DELETE, {"ingress": {"host": f"{name}.example.com"}}))
    for name in ("first", "second"):
        wait_children(admin, NS_DELETE, name, ingress=True)

    def owned_by_both() -> bool:
        objs = analyzer(admin, NS_DELETE)
        return all(
            o and len(o["metadata"].get("ownerReferences") or []) == 2 for o in objs.values()
        )

    wait_for("the analyzer owned by both policies", owned_by_both)
    # No finalizer: deletion never waits for the operator (children go by ownerReference).
    assert not get_policy(admin, NS_DELETE, "first")["metadata"].get("finalizers")

    admin.delete(c.API_VERSION, c.KIND, NS_DELETE, "first")
    wait_gone(admin, NS_DELETE, "first")
    assert all(v is not None for v in analyzer(admin, NS_DELETE).values()), (
        "analyzer went too early"
    )
    assert all(
        v is not None
        for k, v in children(admin, NS_DELETE, "second").items()
        if k != "PersistentVolumeClaim"  # no model cache in this spec
    )

    admin.delete(c.API_VERSION, c.KIND, NS_DELETE, "second")

    def analyzer_left() -> list[str]:
        return [
            f"{k} (deleting: {bool(v['metadata'].get('deletionTimestamp'))}, "
            f"finalizers: {v['metadata'].get('finalizers')}, "
            f"owners: {v['metadata'].get('ownerReferences')})"
            for k, v in analyzer(admin, NS_DELETE).items()
            if v
        ]

    try:
        # The claim goes last: pvc-protection waits for the analyzer pod to be deleted.
        wait_for(
            "the analyzer removed with the last policy", lambda: not analyzer_left(), timeout_s=90
        )
    except AssertionError as err:
        raise AssertionError(f"{err}; still there: {analyzer_left()}") from None
    wait_gone(admin, NS_DELETE, "second")


def test_drift_in_children_is_corrected(admin: RestKube, session_operator: OperatorProcess) -> None:
    name = "drift"
    admin.create(policy(name, NS_DRIFT))
    found = wait_children(admin, NS_DRIFT, name, ingress=False)
    admin.merge_patch(
        "v1",
        "ConfigMap",
        NS_DRIFT,
        b.config_map_name(name),
        {"data": {c.CONFIG_KEY: "tampered: true\n"}},
    )
    containers = copy.deepcopy(found["Deployment"]["spec"]["template"]["spec"]["containers"])
    containers[0]["image"] = "someone/else:latest"
    admin.merge_patch(
        "apps/v1",
        "Deployment",
        NS_DRIFT,
        name,
        {"spec": {"template": {"spec": {"containers": containers}}}},
    )
    admin.delete("v1", "Service", NS_DRIFT, name)

    def restored() -> bool:
        now = children(admin, NS_DRIFT, name)
        return bool(
            now["Service"]
            and now["ConfigMap"]
            and now["ConfigMap"]["data"][c.CONFIG_KEY] == found["ConfigMap"]["data"][c.CONFIG_KEY]
            and now["Deployment"]
            and now["Deployment"]["spec"]["template"]["spec"]["containers"][0]["image"]
            == found["Deployment"]["spec"]["template"]["spec"]["containers"][0]["image"]
        )

    wait_for("drift corrected", restored)


def wait_gone(kube: RestKube, ns: str, name: str) -> None:
    """Wait for the garbage collector to remove a deleted policy's children."""

    def left() -> list[str]:
        return [k for k, v in children(kube, ns, name).items() if v]

    try:
        wait_for(f"{ns}/{name}'s children garbage-collected", lambda: not left(), timeout_s=60)
    except AssertionError as err:
        raise AssertionError(f"{err}; still there: {left()}") from None


def _writes_logged(log: str, ns: str, name: str) -> list[str]:
    """The operator's own record of its writes while reconciling a policy (Controller.reconcile
    logs each reconcile's child writes as ``<ns>/<name>: create|apply|delete ...``)."""
    return [line for line in log.splitlines() if f" jitserve.operator: {ns}/{name}: " in line]


def _settled(kube: RestKube, ns: str, name: str) -> dict[str, Any] | None:
    """The policy's status once nothing is left to change it (no kubelet: its pods stay
    Pending): kube-controller-manager has rolled the Deployment out to the pods, and the
    operator's status shows that rollout, those pods and a resync's scrape."""
    body = get_policy(kube, ns, name)
    status = body.get("status") or {}
    deployment = kube.get("apps/v1", "Deployment", ns, name)
    if deployment is None:
        return None
    rollout = deployment.get("status") or {}
    want = int(deployment["spec"].get("replicas", 1))
    listed = kube.list("v1", "Pod", ns, b.selector_string(name))
    pods = sorted(p["metadata"]["name"] for p in listed)
    updated, ready = rollout.get("updatedReplicas", 0), rollout.get("readyReplicas", 0)
    rolled_out = (
        rollout.get("observedGeneration") == deployment["metadata"]["generation"]
        and updated == want == rollout.get("replicas", 0) == len(pods)
    )
    shown = (
        status.get("observedGeneration") == body["metadata"]["generation"]
        and "scrapedPods" in status
        and sorted(r["name"] for r in status.get("replicaStatus") or []) == pods
        and condition(body, "Ready").get("message")
        == f"{ready}/{want} replicas ready, {updated} updated"
    )
    return dict(status) if rolled_out and shown else None


def test_second_reconcile_of_an_unchanged_policy_writes_nothing(
    admin: RestKube, session_operator: OperatorProcess
) -> None:
    """Judged by what the operator itself writes (its log of child writes, the policy's
    status), after the world has settled: kube-controller-manager's own writes to the
    Deployment are not the operator's."""
    name = "steady"
    admin.create(policy(name, NS_DRIFT, {"ingress": {"host": "steady.example.com"}}))
    wait_children(admin, NS_DRIFT, name, ingress=True)
    status_before = wait_for("the policy settled", lambda: _settled(admin, NS_DRIFT, name))
    mark = len(session_operator.log())
    assert _writes_logged(session_operator.log()[:mark], NS_DRIFT, name), "no creation logged"
    # A metadata-only change makes kopf run the update handler: a full reconcile.
    merge_patch_policy(admin, NS_DRIFT, name, {"metadata": {"labels": {"touched": "yes"}}})

    def handled() -> bool:
        # kopf stores what it handled once the handler has returned.
        meta = get_policy(admin, NS_DRIFT, name)["metadata"]
        stored = (meta.get("annotations") or {}).get(f"{c.GROUP}/last-handled-configuration")
        labels = (json.loads(stored or "{}").get("metadata") or {}).get("labels") or {}
        return labels.get("touched") == "yes"

    wait_for("the update handler done with the touched label", handled)
    assert _writes_logged(session_operator.log()[mark:], NS_DRIFT, name) == []
    assert get_policy(admin, NS_DRIFT, name)["status"] == status_before


def _normalized(obj: dict[str, Any] | None) -> dict[str, Any]:
    """An object without what differs between two namespaces or two runs."""
    assert obj is not None
    obj = copy.deepcopy(obj)
    meta = obj["metadata"]
    for key in (
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "managedFields",
        "namespace",
        "selfLink",
    ):
        meta.pop(key, None)
    for ref in meta.get("ownerReferences") or []:
        ref.pop("uid", None)
    meta.get("annotations", {}).pop("deployment.kubernetes.io/revision", None)
    meta.get("annotations", {}).pop(APPLIED_HASH, None)  # hashes the namespace too
    obj.pop("status", None)
    spec = obj.get("spec") or {}
    for key in ("clusterIP", "clusterIPs"):
        spec.pop(key, None)
    text = yaml.safe_dump(obj)
    return dict(
        yaml.safe_load(text.replace(f"{NS_RESTART}", "<ns>").replace(f"{NS_REFERENCE}", "<ns>"))
    )


NS_RESTART, NS_REFERENCE = OTHER_NAMESPACES


def test_operator_killed_mid_reconcile_converges_to_the_uninterrupted_state(
    admin: RestKube, operator_kubeconfig: Path, tmp_path: Path
) -> None:
    spec = {"ingress": {"host": "restart.example.com"}, "fairness": {"weight": 0.3}}
    for ns in (NS_RESTART, NS_REFERENCE):
        ensure_namespace(admin, ns)
    log = tmp_path / "operator.log"
    # Uninterrupted run, for reference.
    reference = OperatorProcess(operator_kubeconfig, [NS_REFERENCE], log).start()
    try:
        admin.create(policy("svc", NS_REFERENCE, spec))
        wait_children(admin, NS_REFERENCE, "svc", ingress=True)
        wait_for("reference analyzer", lambda: all(analyzer(admin, NS_REFERENCE).values()))
    finally:
        reference.stop()

    # Interrupted run: the operator dies (exit 137, like kill -9) right after its 2nd write.
    crashing = OperatorProcess(
        operator_kubeconfig,
        [NS_RESTART],
        log,
        env={"JITSERVE_OPERATOR_FAULT_EXIT_AFTER_WRITES": "2"},
    ).start()
    admin.create(policy("svc", NS_RESTART, spec))
    assert crashing.wait(timeout_s=60) == 137, crashing.log()
    partial = children(admin, NS_RESTART, "svc")
    assert partial["ConfigMap"] is not None and partial["Secret"] is not None
    assert (
        partial["Service"] is None and partial["Deployment"] is None and partial["Ingress"] is None
    ), "the crash came too late"

    restarted = OperatorProcess(operator_kubeconfig, [NS_RESTART], log).start()
    try:
        wait_children(admin, NS_RESTART, "svc", ingress=True)
        wait_for("analyzer after restart", lambda: all(analyzer(admin, NS_RESTART).values()))
        def conditions_now() -> dict[str, str] | None:
            body = get_policy(admin, NS_RESTART, "svc")
            generation = body["metadata"]["generation"]
            conds = (body.get("status") or {}).get("conditions") or []
            current = (body.get("status") or {}).get("observedGeneration") == generation and all(
                x.get("observedGeneration") == generation for x in conds
            )
            return {x["type"]: x["status"] for x in conds} if current and conds else None

        conds = wait_for("the restarted operator's conditions", conditions_now)
        got = {
            k: _normalized(v)
            for k, v in children(admin, NS_RESTART, "svc").items()
            if v is not None
        }
        want = {
            k: _normalized(v)
            for k, v in children(admin, NS_REFERENCE, "svc").items()
            if v is not None
        }
        for kind in want:
            got[kind]["metadata"].pop("generation", None)
            want[kind]["metadata"].pop("generation", None)
            assert got[kind] == want[kind], kind
        got_a = {k: _normalized(v) for k, v in analyzer(admin, NS_RESTART).items()}
        want_a = {k: _normalized(v) for k, v in analyzer(admin, NS_REFERENCE).items()}
        assert got_a == want_a
        assert conds == {"Ready": "False", "Progressing": "True", "Degraded": "False"}
    finally:
        restarted.stop()
        for ns in (NS_RESTART, NS_REFERENCE):
            admin.request("DELETE", f"/api/v1/namespaces/{ns}")


def sidecar_contract_metrics() -> tuple[Any, Any, Any, Any]:
    """(requests counter, goodput counter, cutoff gauge, registry) as the sidecar exports them."""
    try:
        from jitserve.sidecar.metrics import SidecarMetrics
    except ImportError:  # the sidecar package is not in this tree: the contract, by hand
        from prometheus_client import CollectorRegistry, Counter, Gauge

        registry = CollectorRegistry()
        return (
            Counter(
                "jitserve_requests",
                "Finished requests by outcome.",
                ["tenant", "kind", "slo_class", "outcome"],
                registry=registry,
            ),
            Counter(
                "jitserve_goodput_tokens",
                "Tokens that met their SLO.",
                ["tenant", "kind", "slo_class"],
                registry=registry,
            ),
            Gauge("jitserve_effective_cutoff", "Cutoff p in effect.", registry=registry),
            registry,
        )
    metrics = SidecarMetrics()
    return metrics.requests, metrics.goodput_tokens, metrics.effective_cutoff, metrics.registry


def test_status_shows_attainment_read_from_a_sidecar_metrics_endpoint(
    admin: RestKube, session_operator: OperatorProcess
) -> None:
    """A real Prometheus endpoint on loopback stands in for the sidecar container.

    It serves the sidecar's own metrics registry (``jitserve.sidecar.metrics.SidecarMetrics``)
    over HTTP with prometheus_client — or, where the sidecar package is not there, a
    registry with the contract's three families defined here. No kubelet runs here, so the
    test marks the pod Running with IP 127.0.0.1; the operator finds it by label and
    scrapes http://127.0.0.1:<sidecar.adminPort>/metrics exactly as it scrapes pod IPs in a
    cluster.
    """
    from tests.support.k8s import free_port

    requests, goodput, cutoff, registry = sidecar_contract_metrics()
    requests.labels("a", "latency", "chat", "met").inc(9)
    requests.labels("a", "latency", "chat", "missed").inc(1)
    requests.labels("b", "deadline", "batch", "met").inc(3)
    requests.labels("b", "deadline", "batch", "retired").inc(1)
    requests.labels("b", "deadline", "batch", "cancelled").inc(5)
    cutoff.set(0.85)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        name = "metered"
        # The operator reads the admin port (no key needed, not in the Service).
        admin.create(policy(name, NS_METRICS, {"sidecar": {"adminPort": port}, "replicas": 1}))
        wait_children(admin, NS_METRICS, name, ingress=False)
        wait_for("the pod", lambda: admin.list("v1", "Pod", NS_METRICS, b.selector_string(name)))
        assert mark_pods_running(admin, NS_METRICS, name) == 1

        def attainment() -> dict[str, Any] | None:
            status = get_policy(admin, NS_METRICS, name).get("status") or {}
            return status if status.get("attainment") else None

        status = wait_for("attainment in status", attainment)
        assert status["attainment"] == {
            "latency": 0.9,
            "deadline": 0.75,
            "overall": round(12 / 14, 4),
        }
        assert status["effectiveCutoff"] == 0.85
        assert status["scrapedPods"] == 1

        # Goodput rate needs two scrapes: the counter moves, the rate shows up.
        def rate() -> float | None:
            goodput.labels("a", "latency", "chat").inc(500)
            value = (get_policy(admin, NS_METRICS, name).get("status") or {}).get(
                "goodputTokensPerSecond"
            )
            return value if value else None

        assert wait_for("goodput tokens/s in status", rate, every_s=0.5) > 0
    finally:
        # Not left for every later resync pass of the session operator to reconcile.
        with contextlib.suppress(KubeError):
            admin.delete(c.API_VERSION, c.KIND, NS_METRICS, name)
        server.shutdown()
        thread.join(timeout=5)


def test_null_for_an_optional_section_is_pruned_by_the_api_server(admin: RestKube) -> None:
    """The CRD has no `nullable` (kubectl explain would lose those fields): the API server
    drops a null before defaulting, so `ingress: null` means "no ingress"."""
    ensure_namespace(admin, NS_INVALID)
    created = admin.create(policy("nulls", NS_INVALID, {"ingress": None, "model": {"cache": None}}))
    assert "ingress" not in created["spec"] and "cache" not in created["spec"]["model"]
    assert load_policy(created["spec"]).ingress is None


def test_fields_dropped_from_the_spec_leave_the_children(
    admin: RestKube, session_operator: OperatorProcess
) -> None:
    """Server-side apply against the real API server: an Ingress annotation and a
    toleration removed from the policy disappear from the children; an annotation someone
    else put on the Ingress stays."""
    name = "dropped"
    spec = {
        "ingress": {"host": "dropped.example.com", "annotations": {"keep": "1", "drop": "2"}},
        "pod": {"tolerations": [{"key": "gpu", "operator": "Exists"}]},
    }
    admin.create(policy(name, NS_DRIFT, spec))
    wait_children(admin, NS_DRIFT, name, ingress=True)
    admin.merge_patch(
        "networking.k8s.io/v1",
        "Ingress",
        NS_DRIFT,
        name,
        {"metadata": {"annotations": {"someone-else": "x"}}},
    )
    merge_patch_policy(
        admin,
        NS_DRIFT,
        name,
        {"spec": {"ingress": {"annotations": {"drop": None}}, "pod": {"tolerations": None}}},
    )

    def converged() -> bool:
        ingress = admin.get("networking.k8s.io/v1", "Ingress", NS_DRIFT, name) or {}
        annotations = ingress.get("metadata", {}).get("annotations") or {}
        deployment = admin.get("apps/v1", "Deployment", NS_DRIFT, name) or {}
        pod = deployment.get("spec", {}).get("template", {}).get("spec", {})
        return (
            "drop" not in annotations
            and annotations.get("keep") == "1"
            and annotations.get("someone-else") == "x"
            and "tolerations" not in pod
        )

    wait_for("the dropped annotation and toleration gone", converged)
