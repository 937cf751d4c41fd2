"""Pod knobs of the SLOPolicy (env from Secrets, scheduling, volumes, model cache): what the
builders make of them and the cross-field rules the webhook enforces (pure, no cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from jitserve.operator import builders as b
from jitserve.operator.admission import admission_problems
from jitserve.policy import SLOPolicySpec, load_policy

REF = b.PolicyRef(name="chat", namespace="team-a", uid="1234")
SETTINGS = b.OperatorSettings()

KNOBS: dict[str, Any] = {
    "model": {
        "env": [
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "PLAIN", "value": "1"},
        ],
        "volumeMounts": [{"name": "adapters", "mountPath": "/adapters", "readOnly": True}],
        "cache": {"size": "200Gi", "storageClassName": "fast", "accessMode": "ReadWriteMany"},
    },
    "pod": {
        "nodeSelector": {"nvidia.com/gpu.product": "H100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        "imagePullSecrets": [{"name": "regcred"}],
        "runtimeClassName": "nvidia",
        "priorityClassName": "llm-serving",
        "labels": {"team": "search"},
        "annotations": {"example.com/cost-center": "42"},
        "volumes": [{"name": "adapters", "persistentVolumeClaim": {"claimName": "lora"}}],
    },
}


def pod_of(spec: SLOPolicySpec) -> dict[str, Any]:
    template: dict[str, Any] = b.build_deployment(REF, spec, SETTINGS)["spec"]["template"]
    return template


def test_knobs_reach_the_pod_template() -> None:
    spec = load_policy(KNOBS)
    assert spec.cross_field_problems() == []
    template = pod_of(spec)
    pod = template["spec"]
    vllm = pod["containers"][0]
    env = {e["name"]: e for e in vllm["env"]}
    assert env["HF_TOKEN"] == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}},
    }
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["PLAIN"] == {"name": "PLAIN", "value": "1"}
    assert {"name": "adapters", "mountPath": "/adapters", "readOnly": True} in vllm["volumeMounts"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert pod["affinity"] == KNOBS["pod"]["affinity"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["runtimeClassName"] == "nvidia" and pod["priorityClassName"] == "llm-serving"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["adapters"] == {
        "name": "adapters",
        "persistentVolumeClaim": {"claimName": "lora"},
    }
    assert volumes["cache"] == {
        "name": "cache",
        "persistentVolumeClaim": {"claimName": "chat-model-cache"},
    }
    assert template["metadata"]["labels"]["team"] == "search"
    assert template["metadata"]["labels"]["jitserve.io/policy"] == "chat"
    assert template["metadata"]["annotations"]["example.com/cost-center"] == "42"


def test_model_cache_claim_is_a_child_unless_the_user_brings_one() -> None:
    children = b.build_policy_children(REF, load_policy(KNOBS), SETTINGS)
    (claim,) = [c for c in children if c["kind"] == "PersistentVolumeClaim"]
    assert claim["metadata"]["name"] == "chat-model-cache"
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "1234"
    assert claim["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "200Gi"}},
        "storageClassName": "fast",
    }
    own = load_policy({"model": {"cache": {"existingClaim": "models"}}})
    assert not [
        c
        for c in b.build_policy_children(REF, own, SETTINGS)
        if c["kind"] == "PersistentVolumeClaim"
    ]
    cache = {v["name"]: v for v in pod_of(own)["spec"]["volumes"]}["cache"]
    assert cache == {"name": "cache", "persistentVolumeClaim": {"claimName": "models"}}
    # Without a cache section the model cache is an emptyDir, as before.
    plain = {v["name"]: v for v in pod_of(SLOPolicySpec())["spec"]["volumes"]}["cache"]
    assert plain == {"name": "cache", "emptyDir": {}}


def test_pod_knobs_roll_the_pods_scheduler_knobs_do_not() -> None:
    base = pod_of(SLOPolicySpec())
    for change in (
        {"pod": {"nodeSelector": {"a": "b"}}},
        {"pod": {"runtimeClassName": "nvidia"}},
        {
            "model": {
                "env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
            }
        },
        {"model": {"cache": {"size": "10Gi"}}},
    ):
        assert pod_of(load_policy(change)) != base, change
    assert pod_of(load_policy({"reporting": {"attainmentWindowSeconds": 60}})) == base


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (
            {
                "model": {
                    "env": [
                        {"name": "A", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "a"}}}
                    ]
                }
            },
            "spec.model.env[0].valueFrom: set value or valueFrom, not both",
        ),
        (
            {"model": {"env": [{"name": "A", "valueFrom": {}}]}},
            "spec.model.env[0].valueFrom: exactly one of secretKeyRef, configMapKeyRef, fieldRef",
        ),
        (
            {"model": {"volumeMounts": [{"name": "nope", "mountPath": "/x"}]}},
            "spec.model.volumeMounts[0].name: no volume 'nope' in pod.volumes",
        ),
        (
            {"model": {"volumeMounts": [{"name": "cache", "mountPath": "/tmp"}]}},
            "spec.model.volumeMounts[0].mountPath: /tmp is the operator's own",
        ),
        (
            {"pod": {"volumes": [{"name": "config", "emptyDir": {}}]}},
            "spec.pod.volumes[0].name: 'config' is the operator's own volume",
        ),
        (
            {"pod": {"volumes": [{"name": "two", "emptyDir": {}, "secret": {"secretName": "s"}}]}},
            "spec.pod.volumes[0]: needs exactly one volume source",
        ),
        (
            {"pod": {"labels": {"app.kubernetes.io/component": "x"}}},
            "spec.pod.labels.app.kubernetes.io/component: the operator's own label",
        ),
        (
            {"model": {"cache": {"existingClaim": "c", "storageClassName": "fast"}}},
            "spec.model.cache.storageClassName: only for a claim the operator makes",
        ),
        ({"ingress": {"tlsSecret": "cert"}}, "spec.ingress.tlsSecret: TLS needs ingress.host"),
        ({"sidecar": {"port": 8000}}, "spec.sidecar.port: 8000 is also model.port"),
    ],
    ids=[
        "env-both",
        "env-no-source",
        "mount-undeclared",
        "mount-reserved-path",
        "volume-reserved-name",
        "volume-two-sources",
        "label-reserved",
        "cache-class-with-claim",
        "tls-without-host",
        "port-clash",
    ],
)
def test_webhook_refuses_cross_field_violations_naming_the_field(
    spec: dict[str, Any], field: str
) -> None:
    body = {"metadata": {"name": "chat", "namespace": "team-a"}, "spec": spec}
    problems = admission_problems(body)
    assert any(p.startswith(field) for p in problems), problems


def test_webhook_lets_metadata_only_updates_through() -> None:
    """kopf's annotations and label edits on a policy stored before the webhook existed."""
    bad = {"metadata": {"name": "chat"}, "spec": {"ingress": {"tlsSecret": "cert"}}}
    labelled = {"metadata": {"name": "chat", "labels": {"x": "y"}}, "spec": bad["spec"]}
    assert admission_problems(labelled, old=bad) == []
    fixed = {"metadata": {"name": "chat"}, "spec": {"ingress": {"host": "a.example.com"}}}
    assert admission_problems(fixed, old=bad) == []
    worse = {"metadata": {"name": "chat"}, "spec": {"ingress": {"tlsSecret": "other"}}}
    assert admission_problems(worse, old=bad) != []
    too_long = {"metadata": {"name": "x" * 60}, "spec": {}}
    assert admission_problems(too_long) == [
        "metadata.name: at most 52 characters (children are named after it)"
    ]
