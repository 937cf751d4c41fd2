"""The CRD's CEL rules (``x-kubernetes-validations``) give the webhook's verdicts.

The API server here is 1.20 (no CEL), so the rules are evaluated with cel-python
(:mod:`cel_rules`) on every manifest under manifests/examples/ and
manifests/examples/invalid/, and on one spec per rule built here. A CEL API server's
verdict = its CEL rules + the webhook in CEL mode (only what CEL cannot say); it must
equal the webhook's verdict on an API server without CEL (every rule in Python).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from jitserve.operator import constants as c
from jitserve.operator.admission import admission_problems
from jitserve.operator.crd import crd_object
from tests.support.cel_rules import api_server_verdict
from tests.support.kube_fake import serving

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "manifests" / "examples").glob("*.yaml")) + sorted(
    (ROOT / "manifests" / "examples" / "invalid").glob("*.yaml")
)
SCHEMA: dict[str, Any] = crd_object()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def policies(path: Path) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == c.KIND]
    for doc in docs:
        doc["metadata"].setdefault("namespace", "team-a")
    return docs


def verdicts(obj: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """(webhook without CEL, the CEL rules, webhook with CEL) problems of ``obj``."""
    return (
        admission_problems(copy.deepcopy(obj)),
        api_server_verdict(SCHEMA, copy.deepcopy(obj)),
        admission_problems(copy.deepcopy(obj), cel=True),
    )


@pytest.mark.parametrize("path", MANIFESTS, ids=[p.stem for p in MANIFESTS])
def test_cel_and_webhook_agree_on_every_manifest(path: Path) -> None:
    docs = policies(path)
    assert docs, f"{path}: no SLOPolicy"
    for doc in docs:
        webhook, cel, rest = verdicts(doc)
        assert bool(webhook) == bool(cel or rest), (webhook, cel, rest)
        if path.parent.name == "invalid":
            assert webhook, f"{path.name} is meant to be refused"
        else:
            assert not (webhook or cel or rest), f"{path.name}: {webhook or cel or rest}"


# One spec per cross-field rule (schema-valid, breaking only that rule), and whether a CEL
# rule states it (False: only the webhook can, on every API server).
BROKEN: dict[str, tuple[dict[str, Any], bool]] = {
    "model-name": ({"model": {"gpus": 0}}, True),
    "sidecar-port": (serving({"sidecar": {"port": 8000}}), True),
    "admin-port-is-model-port": (serving({"sidecar": {"adminPort": 8000}}), True),
    "admin-port-is-sidecar-port": (serving({"sidecar": {"adminPort": 8080}}), True),
    "tls-host": (serving({"ingress": {"tlsSecret": "cert"}}), True),
    "env-both": (
        serving({"model": {"env": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.name"}}}]}}),
        True,
    ),
    "env-no-source": (serving({"model": {"env": [{"name": "A", "valueFrom": {}}]}}), True),
    "env-two-sources": (
        serving({"model": {"env": [{"name": "A", "valueFrom": {
            "fieldRef": {"fieldPath": "metadata.name"},
            "secretKeyRef": {"name": "s", "key": "k"},
        }}]}}),
        True,
    ),
    "reserved-volume": (serving({"pod": {"volumes": [{"name": "cache", "emptyDir": {}}]}}), True),
    "undeclared-mount": (
        serving({"model": {"volumeMounts": [{"name": "x", "mountPath": "/x"}]}}),
        True,
    ),
    "reserved-mount-path": (
        serving({
            "model": {"volumeMounts": [{"name": "x", "mountPath": "/etc/jitserve/"}]},
            "pod": {"volumes": [{"name": "x", "emptyDir": {}}]},
        }),
        True,
    ),
    "reserved-label": (serving({"pod": {"labels": {"app.kubernetes.io/name": "x"}}}), True),
    "claim-and-class": (
        serving({"model": {"cache": {"existingClaim": "m", "storageClassName": "fast"}}}),
        True,
    ),
    "default-class": (serving({"sloDefaults": {"defaultClass": "nope"}}), True),
    "tenant-default-class": (
        serving({"fairness": {"tenants": [{"name": "a", "defaultClass": "nope"}]}}),
        True,
    ),
    "tenant-classes": (
        serving({"fairness": {"tenants": [{"name": "a", "classes": ["nope"]}]}}),
        True,
    ),
    "tenant-default-outside-its-classes": (
        serving({
            "sloDefaults": {"classes": [
                {"name": "i", "kind": "deadline", "deadlineSeconds": 9},
                {"name": "j", "kind": "deadline", "deadlineSeconds": 9}]},
            "fairness": {"tenants": [{"name": "a", "classes": ["i"], "defaultClass": "j"}]},
        }),
        True,
    ),
    "latency-class": (
        serving({"sloDefaults": {"classes": [{"name": "i", "kind": "latency", "ttftSeconds": 1}]}}),
        True,
    ),
    "duplicate-tenant": (
        serving({"fairness": {"tenants": [{"name": "a"}, {"name": "a"}]}}),
        True,
    ),
    "volume-without-source": (
        serving({
            "model": {"volumeMounts": [{"name": "x", "mountPath": "/x"}]},
            "pod": {"volumes": [{"name": "x"}]},
        }),
        False,
    ),
    "tensor-parallel": (
        serving({"model": {"gpus": 2, "args": ["--tensor-parallel-size=4"]}}),
        False,
    ),
    "max-num-seqs": (serving({"model": {"args": ["--max-num-seqs", "many"]}}), False),
    "autoscaling-min-above-max": (
        serving({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}), True,
    ),
    "autoscaling-without-capacity": (serving({"autoscaling": {"enabled": True}}), True),
}
MODEL_VALIDATED = ("latency-class", "autoscaling-min-above-max", "autoscaling-without-capacity")
"""Cases whose rule is also the pydantic model's own validator, which every loader of a
policy file runs: the webhook in CEL mode refuses them too."""


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_each_cross_field_rule_is_refused_by_cel_or_by_the_webhook_alone(case: str) -> None:
    spec, by_cel = BROKEN[case]
    obj = {"apiVersion": c.API_VERSION, "kind": c.KIND,
           "metadata": {"name": "p", "namespace": "team-a"}, "spec": spec}
    webhook, cel, rest = verdicts(obj)
    assert webhook, "the webhook (no CEL) refuses it"
    assert bool(cel) == by_cel, cel
    # CEL mode keeps only what CEL cannot say (and the model's own validators).
    assert bool(rest) == (not by_cel) or case in MODEL_VALIDATED, rest
    fixed = {**obj, "spec": serving()}
    assert verdicts(fixed) == ([], [], [])


def test_the_policy_name_rule_is_a_cel_rule_on_the_root() -> None:
    obj = {"apiVersion": c.API_VERSION, "kind": c.KIND,
           "metadata": {"name": "x" * 53, "namespace": "team-a"}, "spec": serving()}
    webhook, cel, rest = verdicts(obj)
    assert webhook and cel and not rest
    obj["metadata"]["name"] = "a.b"
    assert all(verdicts(obj)[:2]) and not verdicts(obj)[2]


class _Versioned:
    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def request(self, method: str, path: str) -> Any:
        assert (method, path) == ("GET", "/version")
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize(
    ("answer", "cel"),
    [
        ({"major": "1", "minor": "20"}, False),
        ({"major": "1", "minor": "24+"}, False),
        ({"major": "1", "minor": "25"}, True),
        ({"major": "1", "minor": "33"}, True),
        ({}, False),
        (OSError("no route"), False),
    ],
)
def test_the_webhook_relies_on_cel_only_where_the_api_server_has_it(answer: Any, cel: bool) -> None:
    from jitserve.operator.cli import api_server_has_cel

    assert api_server_has_cel(_Versioned(answer)) is cel
