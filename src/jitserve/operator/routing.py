"""How clients and monitors reach a policy's pods (pure): the Service and the optional
Ingress route only the sidecar's API port (``http``), the Ingress through the fleet's
gateway when there is one (``spec.replicas`` > 1); the NetworkPolicy keeps vLLM's port
and the sidecar's admin port (metrics, /debug/scheduler, the replica report) to the
monitoring and operator namespaces and to the policy's own gateway and endpoint-picker
pods, which place on the reports."""

from __future__ import annotations

from jitserve.operator import constants as c
from jitserve.operator.naming import (
    JSON,
    PolicyRef,
    child_meta,
    gateway_name,
    selector_labels,
    uses_gateway,
)
from jitserve.policy import SLOPolicySpec


def build_service(ref: PolicyRef, spec: SLOPolicySpec) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_meta(ref, ref.name, "serving"),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(ref.name),
            "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def policy_url(ref: PolicyRef, spec: SLOPolicySpec) -> str:
    """The address clients use (``status.url``, the URL column): the Ingress's host when
    it names one, else the in-cluster name of the Service its requests enter by."""
    ing = spec.ingress
    if ing is not None and ing.host:
        scheme = "https" if ing.tls_secret else "http"
        return f"{scheme}://{ing.host}{ing.path.rstrip('/')}"
    entry = gateway_name(ref.name) if uses_gateway(spec.replicas) else ref.name
    return f"http://{entry}.{ref.namespace}.svc.cluster.local"


def build_network_policy(ref: PolicyRef, watchers: list[str]) -> JSON:
    """Clients reach only the sidecar's API port; vLLM's port and the admin port (metrics,
    /debug/scheduler) admit only the monitoring namespace and the operator's, and the
    admin port the policy's gateway and endpoint-picker pods (its replica report). The sidecar
    reaches vLLM over the pod's loopback, which no NetworkPolicy filters. ``watchers``:
    the namespaces admitted to those ports."""
    sources: list[JSON] = [
        {"namespaceSelector": {"matchLabels": {c.NAMESPACE_NAME_LABEL: ns}}} for ns in watchers
    ]
    placers = {"podSelector": {"matchExpressions": [
        {"key": c.LABEL_POLICY, "operator": "In", "values": [ref.name]},
        {"key": c.LABEL_COMPONENT, "operator": "In", "values": list(c.PLACER_COMPONENTS)},
    ]}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_meta(ref, ref.name, "serving"),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(ref.name)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": [{"protocol": "TCP", "port": "http"}]},
                {"from": [placers], "ports": [{"protocol": "TCP", "port": c.ADMIN_PORT_NAME}]},
                {
                    "from": sources,
                    "ports": [
                        {"protocol": "TCP", "port": c.ADMIN_PORT_NAME},
                        {"protocol": "TCP", "port": "vllm"},
                    ],
                },
            ],
        },
    }


def build_ingress(ref: PolicyRef, spec: SLOPolicySpec) -> JSON | None:
    """The Ingress to the gateway's Service with more than one pod, else the pods'."""
    ing = spec.ingress
    if ing is None:
        return None
    target = gateway_name(ref.name) if uses_gateway(spec.replicas) else ref.name
    rule: JSON = {
        "http": {
            "paths": [
                {
                    "path": ing.path,
                    "pathType": "Prefix",
                    "backend": {"service": {"name": target, "port": {"name": "http"}}},
                }
            ]
        }
    }
    if ing.host:
        rule["host"] = ing.host
    body: JSON = {"rules": [rule]}
    if ing.class_name:
        body["ingressClassName"] = ing.class_name
    if ing.tls_secret and ing.host:
        body["tls"] = [{"hosts": [ing.host], "secretName": ing.tls_secret}]
    meta = child_meta(ref, ref.name, "ingress")
    if ing.annotations:
        meta["annotations"] = dict(sorted(ing.annotations.items()))
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": meta, "spec": body}
