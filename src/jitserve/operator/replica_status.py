"""Per-replica readiness for an SLOPolicy's status (pure; owner: operator).

``status.replicaStatus`` lists each serving pod by name with its Ready condition as the
kubelet reports it (the sidecar's ``/ready``: vLLM answers and the policy is loaded) and,
when not ready, why; ``status.gateway`` counts the fleet's gateway pods (``spec.replicas``
> 1). The gateway and the endpoint picker place only on ready replicas; these fields let
``kubectl get slopolicy -o yaml`` show which ones those are.
"""

from __future__ import annotations

from collections.abc import Iterable

from jitserve.operator.naming import JSON
from jitserve.policy import MAX_REPLICA_STATUS, GatewayStatus, ReplicaStatus


def _waiting_reason(pod: JSON) -> str | None:
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return f"{container.get('name', '?')}: {waiting['reason']}"
    return None


def pod_readiness(pod: JSON) -> ReplicaStatus:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    ready_condition: JSON = next((c for c in status.get("conditions") or []
                            if c.get("type") == "Ready"), {})
    ready = ready_condition.get("status") == "True" and not meta.get("deletionTimestamp")
    reason: str | None = None
    if meta.get("deletionTimestamp"):
        reason = "Terminating"
    elif not ready:
        reason = (_waiting_reason(pod) or ready_condition.get("reason")
                  or status.get("phase") or "Unknown")
    return ReplicaStatus(name=str(meta.get("name", "")), ready=ready, reason=reason,
                         podIP=status.get("podIP") or None)


def replica_status(pods: Iterable[JSON]) -> list[ReplicaStatus]:
    """The serving pods by name (at most :data:`MAX_REPLICA_STATUS`)."""
    listed = sorted((pod_readiness(p) for p in pods), key=lambda r: r.name)
    return listed[:MAX_REPLICA_STATUS]


def gateway_status(deployment: JSON | None) -> GatewayStatus | None:
    """The gateway Deployment's desired and ready pods (None: it does not exist)."""
    if deployment is None:
        return None
    return GatewayStatus(
        replicas=int((deployment.get("spec") or {}).get("replicas", 0)),
        ready_replicas=int((deployment.get("status") or {}).get("readyReplicas", 0)),
    )
