"""How clients and monitors reach a policy's pods (pure): the Service and the optional
Ingress route only the sidecar's API port (``http``); the NetworkPolicy keeps vLLM's port
and the sidecar's admin port (metrics, /debug/scheduler) to the monitoring and operator
namespaces."""

from __future__ import annotations

from jitserve.operator import constants as c
from jitserve.operator.naming import JSON, PolicyRef, child_meta, selector_labels
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


def build_network_policy(ref: PolicyRef, watchers: list[str]) -> JSON:
    """Clients reach only the sidecar's API port; vLLM's port and the admin port (metrics,
    /debug/scheduler) admit only the monitoring namespace and the operator's. The sidecar
    reaches vLLM over the pod's loopback, which no NetworkPolicy filters. ``watchers``:
    the namespaces admitted to those ports."""
    sources = [
        {"namespaceSelector": {"matchLabels": {c.NAMESPACE_NAME_LABEL: ns}}} for ns in watchers
    ]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_meta(ref, ref.name, "serving"),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(ref.name)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {"ports": [{"protocol": "TCP", "port": "http"}]},
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
    ing = spec.ingress
    if ing is None:
        return None
    rule: JSON = {
        "http": {
            "paths": [
                {
                    "path": ing.path,
                    "pathType": "Prefix",
                    "backend": {"service": {"name": ref.name, "port": {"name": "http"}}},
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
