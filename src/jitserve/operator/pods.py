"""What every pod the operator makes shares (pure): the operator-wide settings that name
their images, the pod and container hardening, and requests equal to limits."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from jitserve import __version__
from jitserve.operator.naming import JSON


class OperatorSettings(BaseModel):
    """Operator-wide settings (flags / environment of ``jitserve operator``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sidecar_image: str = f"jitserve/sidecar:{__version__}"
    analyzer_image: str = f"jitserve/analyzer:{__version__}"
    image_pull_policy: str = Field(default="IfNotPresent", pattern=r"^(Always|IfNotPresent|Never)$")
    analyzer_storage: str = "1Gi"
    analyzer_storage_class: str | None = None
    status_interval_seconds: float = Field(default=15.0, gt=0)
    scrape_timeout_seconds: float = Field(default=2.0, gt=0)
    # Who may reach the serving pods' admin and vLLM ports (the NetworkPolicy): Prometheus
    # in the monitoring namespace, and the operator itself (its status scrape).
    monitoring_namespace: str = "monitoring"
    operator_namespace: str | None = None
    # The API server evaluates the CRD's CEL rules (Kubernetes >= 1.25): the webhook then
    # checks only what they cannot say.
    api_server_cel: bool = False


def pod_hardening() -> dict[str, Any]:
    """Pod-level settings shared by every pod the operator makes: non-root, default
    seccomp, no service-account token, no service environment variables."""
    return {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
    }


def resources(cpu: str, memory: str, extra_limits: dict[str, str] | None = None) -> JSON:
    limits = {"cpu": cpu, "memory": memory, **(extra_limits or {})}
    return {"requests": {"cpu": cpu, "memory": memory}, "limits": limits}


CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
}
