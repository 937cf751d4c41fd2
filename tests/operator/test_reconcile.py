"""Reconcile against an in-memory API: idempotence, drift, invalid specs, analyzer owners."""

from __future__ import annotations

from typing import Any

import pytest

from jitserve.operator import builders as b
from jitserve.operator import constants as c
from jitserve.operator.reconcile import Scraper, is_subset, reconcile
from tests.support.kube_fake import FakeKube, serving
from tests.support.waiting import wait_until

SETTINGS = b.OperatorSettings()
NS = "team-a"


def policy(kube: FakeKube, name: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return kube.add(
        {
            "apiVersion": c.API_VERSION,
            "kind": c.KIND,
            "metadata": {"name": name, "namespace": NS},
            "spec": serving(spec),
        }
    )


def fresh(kube: FakeKube, name: str) -> dict[str, Any]:
    body = kube.get(c.API_VERSION, c.KIND, NS, name)
    assert body is not None
    return body


def test_first_reconcile_creates_children_second_writes_nothing() -> None:
    kube = FakeKube()
    policy(kube, "chat", {"ingress": {"host": "chat.example.com"}})
    out = reconcile(kube, fresh(kube, "chat"), SETTINGS)
    kinds = sorted(w.split()[1] for w in out.writes)
    assert kinds == sorted(
        [
            "ConfigMap",
            "Secret",
            "Service",
            "NetworkPolicy",
            "Deployment",
            "Ingress",
            "PersistentVolumeClaim",
            "Service",
            "Deployment",
        ]
    )
    assert out.status_written
    kube.writes.clear()
    again = reconcile(kube, fresh(kube, "chat"), SETTINGS)
    assert again.writes == [] and not again.status_written
    assert kube.writes == []


def test_drift_is_corrected() -> None:
    kube = FakeKube()
    policy(kube, "chat")
    reconcile(kube, fresh(kube, "chat"), SETTINGS)
    cm = kube.objects[("v1", "ConfigMap", NS, "chat-config")]
    cm["data"]["policy.yaml"] = "tampered"
    dep = kube.objects[("apps/v1", "Deployment", NS, "chat")]
    dep["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:latest"
    dep["spec"]["replicas"] = 7
    del kube.objects[("v1", "Service", NS, "chat")]
    out = reconcile(kube, fresh(kube, "chat"), SETTINGS)
    assert sorted(out.writes) == sorted(
        [
            f"apply ConfigMap {NS}/chat-config",
            f"apply Deployment {NS}/chat",
            f"create Service {NS}/chat",
        ]
    )
    dep = kube.objects[("apps/v1", "Deployment", NS, "chat")]
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "vllm/vllm-openai:v0.32.0"
    assert dep["spec"]["replicas"] == 1
    assert reconcile(kube, fresh(kube, "chat"), SETTINGS).writes == []


def test_tuning_p_and_f_rewrites_only_the_config_map() -> None:
    kube = FakeKube()
    body = policy(kube, "chat")
    reconcile(kube, fresh(kube, "chat"), SETTINGS)
    template_before = kube.objects[("apps/v1", "Deployment", NS, "chat")]["spec"]["template"]
    kube.objects[(c.API_VERSION, c.KIND, NS, "chat")]["spec"] = serving(
        {"scheduler": {"cutoff": {"mode": "fixed", "value": 0.6}}, "fairness": {"weight": 0.4}}
    )
    out = reconcile(kube, fresh(kube, "chat"), SETTINGS)
    assert out.writes == [f"apply ConfigMap {NS}/chat-config"]
    assert (
        kube.objects[("apps/v1", "Deployment", NS, "chat")]["spec"]["template"] == template_before
    )
    assert body["metadata"]["uid"]


def test_invalid_spec_writes_no_children_and_reports_degraded() -> None:
    kube = FakeKube()
    policy(kube, "bad", {"ingress": {"tlsSecret": "x"}, "fairness": {"weight": 3}})
    out = reconcile(kube, fresh(kube, "bad"), SETTINGS)
    assert out.writes == []
    assert any("spec.fairness.weight" in p for p in out.problems)
    status = fresh(kube, "bad")["status"]
    degraded = next(x for x in status["conditions"] if x["type"] == "Degraded")
    assert degraded["status"] == "True" and "spec.fairness.weight" in degraded["message"]


def test_cross_field_rule_is_degraded_with_the_field() -> None:
    kube = FakeKube()
    policy(kube, "tls", {"ingress": {"tlsSecret": "x"}})
    out = reconcile(kube, fresh(kube, "tls"), SETTINGS)
    assert out.problems == ["spec.ingress.tlsSecret: TLS needs ingress.host"]


def test_removing_the_ingress_section_deletes_the_ingress() -> None:
    kube = FakeKube()
    policy(kube, "chat", {"ingress": {"host": "a.example.com"}})
    reconcile(kube, fresh(kube, "chat"), SETTINGS)
    kube.objects[(c.API_VERSION, c.KIND, NS, "chat")]["spec"] = serving()
    out = reconcile(kube, fresh(kube, "chat"), SETTINGS)
    # The ConfigMap is the whole spec (the sidecar's config file), so it changes too.
    assert out.writes == [f"apply ConfigMap {NS}/chat-config", f"delete Ingress {NS}/chat"]


def test_analyzer_owned_by_all_policies_in_the_namespace() -> None:
    kube = FakeKube()
    a = policy(kube, "a")
    bb = policy(kube, "b")
    reconcile(kube, fresh(kube, "a"), SETTINGS)
    reconcile(kube, fresh(kube, "b"), SETTINGS)
    for kind in ("apps/v1", "Deployment"), ("v1", "Service"), ("v1", "PersistentVolumeClaim"):
        obj = kube.objects[(*kind, NS, c.ANALYZER_NAME)]
        uids = {r["uid"] for r in obj["metadata"]["ownerReferences"]}
        assert uids == {a["metadata"]["uid"], bb["metadata"]["uid"]}


def test_api_errors_become_a_degraded_condition() -> None:
    kube = FakeKube()
    policy(kube, "chat")
    kube.fail_kinds = {"Service"}
    out = reconcile(kube, fresh(kube, "chat"), SETTINGS)
    assert out.errors and "injected failure" in out.errors[0]
    degraded = next(
        x for x in fresh(kube, "chat")["status"]["conditions"] if x["type"] == "Degraded"
    )
    assert degraded["reason"] == "ApplyFailed"


def test_status_reads_sidecar_metrics_of_running_pods() -> None:
    kube = FakeKube()
    policy(kube, "chat", {"sidecar": {"adminPort": 9999}})  # the scrape reads the admin port
    reconcile(kube, fresh(kube, "chat"), SETTINGS)
    kube.add(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "chat-1", "namespace": NS, "labels": b.selector_labels("chat")},
            "status": {"phase": "Running", "podIP": "10.1.2.3"},
        }
    )
    kube.add(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "chat-2", "namespace": NS, "labels": b.selector_labels("chat")},
            "status": {"phase": "Pending"},
        }
    )
    seen: list[str] = []
    totals = iter([100.0, 300.0])

    def fetch(url: str, timeout: float) -> str:
        seen.append(url)
        total = next(totals)
        return (
            'jitserve_requests_total{tenant="a",kind="latency",slo_class="x",outcome="met"} 9\n'
            'jitserve_requests_total{tenant="a",kind="latency",slo_class="x",outcome="missed"} 1\n'
            f'jitserve_goodput_tokens_total{{tenant="a",kind="latency",slo_class="x"}} {total}\n'
            f'jitserve_tenant_demand_tokens_total{{tenant="a"}} {2 * total}\n'
            "jitserve_effective_cutoff 0.9\n"
            "jitserve_fairness_weight 0.5\n"
        )

    clock = iter([0.0, 2.0])
    scraper = Scraper(fetch=fetch, clock=lambda: next(clock))
    reconcile(kube, fresh(kube, "chat"), SETTINGS, scraper)
    reconcile(kube, fresh(kube, "chat"), SETTINGS, scraper)
    assert seen == ["http://10.1.2.3:9999/metrics"] * 2
    status = fresh(kube, "chat")["status"]
    assert status["attainment"] == {"latency": 0.9, "overall": 0.9}
    assert status["effectiveCutoff"] == 0.9
    assert status["goodputTokensPerSecond"] == 100.0
    assert status["scrapedPods"] == 1
    assert status["fairness"] == {
        "weightInEffect": 0.5, "jainIndex": 1.0,
        "tenants": [{"name": "a", "demandTokens": 400, "goodputTokens": 200,
                     "maxMinShare": 1.0, "goodputShare": 1.0}],
    }


@pytest.mark.parametrize(
    ("desired", "live", "same"),
    [
        ({"a": 1}, {"a": 1, "b": 2}, True),
        ({"a": [1, 2]}, {"a": [1, 2, 3]}, False),
        ({"cpu": "500m"}, {"cpu": "0.5"}, True),
        ({"memory": "1Gi"}, {"memory": "1024Mi"}, True),
        ({"memory": "1Gi"}, {"memory": "1G"}, False),
        ({"x": {"y": "z"}}, {"x": {}}, False),
        ({"data": {}, "a": 1}, {"a": 1}, True),
        ({"data": {"k": "v"}}, {}, False),
    ],
)
def test_is_subset(desired: Any, live: Any, same: bool) -> None:
    assert is_subset(desired, live) is same


def test_tenant_api_keys_copied_from_their_secrets_and_missing_ones_reported() -> None:
    kube = FakeKube()
    kube.add(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "gold-key", "namespace": NS},
            "data": {"api-key": "c2VjcmV0"},
        }
    )
    tenants = [
        {"name": "gold", "apiKeySecret": "gold-key"},
        {"name": "lead", "apiKeySecret": "nope"},
    ]
    policy(kube, "chat", {"fairness": {"tenants": tenants}})
    out = reconcile(kube, fresh(kube, "chat"), SETTINGS)
    assert out.errors == ["spec.fairness.tenants[1].apiKeySecret: Secret nope not found"]
    secret = kube.objects[("v1", "Secret", NS, "chat-api-keys")]
    assert secret["data"] == {"gold-key": "c2VjcmV0"}
    degraded = next(
        x for x in fresh(kube, "chat")["status"]["conditions"] if x["type"] == "Degraded"
    )
    assert "spec.fairness.tenants[1].apiKeySecret" in degraded["message"]


def test_controller_resync_reconciles_known_policies_and_forgets_deleted_ones() -> None:
    import threading

    from jitserve.operator.handlers import Controller

    kube = FakeKube()
    policy(kube, "chat")
    controller = Controller(kube, b.OperatorSettings(status_interval_seconds=0.01))
    controller.track(NS, "chat", present=True)
    controller.track(NS, "gone", present=True)  # deleted while the operator was away
    stop = threading.Event()
    thread = threading.Thread(target=controller.resync_forever, args=(stop,))
    thread.start()
    try:
        wait_until(
            "a resync that reconciled chat and forgot gone",
            lambda: ("apps/v1", "Deployment", NS, "chat") in kube.objects
            and controller.known() == [(NS, "chat")],
        )
    finally:
        stop.set()
        thread.join(timeout=5)


def test_server_side_apply_removes_what_the_policy_no_longer_sets() -> None:
    """A dropped Ingress annotation or toleration goes away (hand diffs kept them)."""
    kube = FakeKube()
    policy(
        kube,
        "chat",
        {
            "ingress": {"host": "chat.example.com", "annotations": {"a": "1", "b": "2"}},
            "pod": {"tolerations": [{"key": "gpu", "operator": "Exists"}]},
        },
    )
    reconcile(kube, fresh(kube, "chat"), SETTINGS)
    ingress = kube.objects[("networking.k8s.io/v1", "Ingress", NS, "chat")]
    ingress["metadata"]["annotations"]["someone-else"] = "keep"  # not ours: stays
    kube.merge_patch(
        c.API_VERSION,
        c.KIND,
        NS,
        "chat",
        {"spec": {"ingress": {"annotations": {"b": None}}, "pod": {"tolerations": None}}},
    )
    out = reconcile(kube, fresh(kube, "chat"), SETTINGS)
    assert sorted(out.writes) == [
        f"apply ConfigMap {NS}/chat-config",  # the sidecar's copy of the spec
        f"apply Deployment {NS}/chat",
        f"apply Ingress {NS}/chat",
    ]
    annotations = kube.objects[("networking.k8s.io/v1", "Ingress", NS, "chat")]["metadata"][
        "annotations"
    ]
    assert annotations["a"] == "1" and "b" not in annotations
    assert annotations["someone-else"] == "keep"
    pod = kube.objects[("apps/v1", "Deployment", NS, "chat")]["spec"]["template"]["spec"]
    assert "tolerations" not in pod
    assert reconcile(kube, fresh(kube, "chat"), SETTINGS).writes == []


def test_analyzer_owners_in_the_api_servers_order_are_not_drift() -> None:
    """Server-side apply keeps an ownerReferences list in its live order and appends a new
    owner; the operator sorts the owners by uid. With a newer policy whose uid sorts first,
    every reconcile of either policy re-applied the analyzer (the real API server's order
    never matched), a write each resync, forever."""
    kube = FakeKube()
    for name, uid in (("zeta", "uid-z"), ("alpha", "uid-a")):  # the newer uid sorts first
        kube.add(
            {
                "apiVersion": c.API_VERSION,
                "kind": c.KIND,
                "metadata": {"name": name, "namespace": NS, "uid": uid},
                "spec": serving(),
            }
        )
        reconcile(kube, fresh(kube, name), SETTINGS)
    analyzer = kube.objects[("apps/v1", "Deployment", NS, c.ANALYZER_NAME)]
    assert [o["uid"] for o in analyzer["metadata"]["ownerReferences"]] == ["uid-z", "uid-a"]
    kube.writes.clear()
    for name in ("zeta", "alpha"):
        assert reconcile(kube, fresh(kube, name), SETTINGS).writes == []
    assert kube.writes == []


def test_lists_are_matched_by_merge_key_else_by_position() -> None:
    owners = [{"uid": "b", "name": "x"}, {"uid": "a", "name": "y"}]
    assert is_subset(owners, list(reversed(owners)))
    assert not is_subset(owners, [owners[0], {"uid": "c", "name": "y"}])
    assert is_subset([{"name": "A", "value": "1"}], [{"name": "A", "value": "1", "x": 2}])
    assert not is_subset([{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                         [{"name": "B", "value": "1"}, {"name": "A", "value": "2"}])
    assert not is_subset(["a", "b"], ["b", "a"])  # args: order is meaning
    assert not is_subset([{"port": 1}, {"port": 2}], [{"port": 2}, {"port": 1}])
