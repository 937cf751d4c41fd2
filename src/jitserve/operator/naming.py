"""Identity of an SLOPolicy's children: the policy reference their ownerReferences name,
their names, labels and selectors (pure; every builder module uses these)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jitserve.operator import constants as c

JSON = dict[str, Any]


@dataclass(frozen=True)
class PolicyRef:
    """Identity of an SLOPolicy object, as children need it."""

    name: str
    namespace: str
    uid: str

    def owner_reference(self, *, controller: bool = True) -> JSON:
        ref: JSON = {
            "apiVersion": c.API_VERSION,
            "kind": c.KIND,
            "name": self.name,
            "uid": self.uid,
        }
        if controller:
            ref["controller"] = True
            ref["blockOwnerDeletion"] = True
        return ref


MAX_NAME = 52  # leaves room for "-config", "-gateway" etc. within a 63-character DNS label


def name_problems(name: str) -> list[str]:
    """Child names are DNS labels derived from the policy name."""
    if len(name) > MAX_NAME:
        return [f"metadata.name: at most {MAX_NAME} characters (children are named after it)"]
    if "." in name:
        return ["metadata.name: must not contain '.' (children are Services, DNS labels)"]
    return []


def labels(policy: str, component: str) -> dict[str, str]:
    return {
        c.LABEL_NAME: "jitserve",
        c.LABEL_INSTANCE: policy,
        c.LABEL_COMPONENT: component,
        c.LABEL_MANAGED_BY: c.MANAGED_BY,
        c.LABEL_POLICY: policy,
    }


def selector_labels(policy: str) -> dict[str, str]:
    return {c.LABEL_POLICY: policy, c.LABEL_COMPONENT: "serving"}


def selector_string(policy: str) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(policy).items()))


def uses_gateway(replicas: int) -> bool:
    """More than one serving pod: a gateway places each request on one of them (one
    pod needs none)."""
    return replicas > 1


def gateway_name(policy: str) -> str:
    """The gateway's Deployment and Service (``spec.replicas`` > 1)."""
    return f"{policy}-gateway"


def replicas_service_name(policy: str) -> str:
    """The headless Service whose A records are the serving pods (the gateway's
    ``--discover``)."""
    return f"{policy}-replicas"


def gateway_selector(policy: str) -> dict[str, str]:
    return {c.LABEL_POLICY: policy, c.LABEL_COMPONENT: "gateway"}


def config_map_name(policy: str) -> str:
    return f"{policy}-config"


def api_keys_secret_name(policy: str) -> str:
    return f"{policy}-api-keys"


def child_meta(ref: PolicyRef, name: str, component: str) -> JSON:
    return {
        "name": name,
        "namespace": ref.namespace,
        "labels": labels(ref.name, component),
        "ownerReferences": [ref.owner_reference()],
    }
