"""The ``status`` of an ``SLOPolicy``: conditions per Kubernetes API conventions,
readiness, effective settings and SLO attainment (lifetime and over a recent window).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from jitserve.policy.base import Fraction
from jitserve.policy.base import SpecModel as _Model

MAX_REPLICA_STATUS = 2000
"""Pods listed in ``status.replicaStatus`` (``spec.replicas`` is at most 1000; a rollout
may run both versions' pods)."""


MAX_TENANT_STATUS = 1002
"""Tenants listed in ``status.fairness`` (the policy's at most 1,000, 'default', 'other')."""


class ConditionType(StrEnum):
    READY = "Ready"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"


class Condition(_Model):
    """A Kubernetes-style status condition."""

    type: ConditionType = Field(description="Ready, Progressing or Degraded.")
    status: str = Field(pattern=r"^(True|False|Unknown)$", description="True, False or Unknown.")
    reason: str = Field(
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        max_length=1024,
        description="Why, in one CamelCase word (e.g. InvalidSpec, RollingOut).",
    )
    message: str = Field(default="", max_length=32768, description="Details for humans.")
    last_transition_time: str = Field(
        json_schema_extra={"format": "date-time"},
        description="When status last changed (RFC 3339).",
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation this condition was computed for."
    )


class Attainment(_Model):
    """SLO attainment (met / (met + missed + retired)) per request kind, from the sidecars."""

    latency: Fraction | None = Field(default=None, description="Latency (TTFT/TBT) requests.")
    deadline: Fraction | None = Field(default=None, description="Deadline requests.")
    compound: Fraction | None = Field(default=None, description="Compound program requests.")
    best_effort: Fraction | None = Field(default=None, description="Requests without an SLO.")
    overall: Fraction | None = Field(default=None, description="All requests together.")


class ReplicaStatus(_Model):
    """One serving pod (``status.replicaStatus``): its readiness as the kubelet reports it."""

    name: str = Field(max_length=253, description="The pod's name.")
    ready: bool = Field(description="The pod's Ready condition is True (its sidecar's /ready).")
    reason: str | None = Field(
        default=None,
        max_length=1024,
        description="Why it is not ready: a container's waiting reason (CrashLoopBackOff...), "
        "Terminating, or the pod's phase or Ready reason.",
    )
    pod_ip: str | None = Field(default=None, alias="podIP", max_length=64,
                               description="The pod's IP.")


class GatewayStatus(_Model):
    """The fleet's gateway (``spec.replicas`` > 1): its Deployment's readiness."""

    replicas: int = Field(default=0, ge=0, description="Desired gateway pods.")
    ready_replicas: int = Field(default=0, ge=0, description="Gateway pods that are ready.")


class TenantShare(_Model):
    """One tenant's service against its max-min fair share over the recent window."""

    name: str = Field(max_length=253, description="The tenant, as the sidecars label it "
                      "(the policy's tenants, 'default', and 'other' for any tenant not known).")
    demand_tokens: float = Field(ge=0, description="The goodput its admitted requests would "
                                 "earn by meeting their SLOs (a latency request: max_tokens; "
                                 "others: prompt + max_tokens), in the window, fleet-wide.")
    goodput_tokens: float = Field(ge=0, description="Goodput tokens it earned in the window.")
    max_min_share: Fraction = Field(description="Its max-min fair share of the window's "
                                    "goodput: the tenants' demands water-filled by weight.")
    goodput_share: Fraction = Field(description="Its share of the window's goodput.")


class FairnessStatus(_Model):
    """Fairness as the tenants got it, over ``status.recentWindowSeconds`` (issue 27)."""

    weight_in_effect: float | None = Field(
        default=None, ge=0, le=1, description="Mean f the sidecars' schedulers use now: "
        "spec.fairness.weight, or 0 with scheduler.mechanisms.fairness off or a scheduler "
        "without fairness.")
    jain_index: Fraction = Field(description="Jain's index of the tenants' goodput over their "
                                 "max-min shares: 1 when every tenant got its share.")
    tenants: list[TenantShare] = Field(
        default_factory=list, max_length=MAX_TENANT_STATUS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        description="Each tenant that asked or earned in the window, by name.")


class AutoscalingStatus(_Model):
    """What the operator's planner decided last (``spec.autoscaling.enabled``)."""

    desired_replicas: int = Field(ge=0, description="The planner's count (spec.replicas follows).")
    utilization: float = Field(
        ge=0, le=1, description="Share of replicaCapacity the planner fills now (learned)."
    )
    reason: str = Field(max_length=1024, description="The forecast and attainment behind it.")
    last_decision_time: str = Field(
        json_schema_extra={"format": "date-time"}, description="When it decided (RFC 3339)."
    )
    last_scale_time: str | None = Field(
        default=None, json_schema_extra={"format": "date-time"},
        description="When it last changed spec.replicas (RFC 3339).",
    )


class SLOPolicyStatus(_Model):
    """``status`` of the ``SLOPolicy`` custom resource, written by the operator."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the operator last acted on."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        description="Ready, Progressing and Degraded, one of each.",
    )
    replicas: int = Field(default=0, ge=0, description="Desired serving pods.")
    ready_replicas: int = Field(default=0, ge=0, description="Serving pods that are ready.")
    selector: str | None = Field(
        default=None, description="Label selector of the serving pods (scale subresource)."
    )
    url: str | None = Field(
        default=None,
        description="Where clients send requests: the Ingress's host when it has one, else "
        "the Service in front of the pods (the gateway's with more than one pod), in-cluster.",
    )
    replica_status: list[ReplicaStatus] = Field(
        default_factory=list,
        max_length=MAX_REPLICA_STATUS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        description="Each serving pod by name and whether it is ready (the first "
        f"{MAX_REPLICA_STATUS} by name).",
    )
    gateway: GatewayStatus | None = Field(
        default=None,
        description="The gateway in front of the serving pods (spec.replicas > 1; absent "
        "with one pod).",
    )
    effective_cutoff: float | None = Field(
        default=None, ge=0, le=1, description="Mean p the sidecars use now."
    )
    policy_in_effect: str | None = Field(
        default=None, max_length=1024,
        description="The scheduler the sidecars run now: spec.scheduler.policy, or with auto "
        "the tuner's choice; when pods differ, each with its count, most first "
        "(e.g. 'gmax 2, edf-ac 1').",
    )
    policy_in_effect_since: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When the scheduler in effect last changed on a pod (RFC 3339).",
    )
    autoscaling: AutoscalingStatus | None = Field(
        default=None,
        description="The planner's last decision (absent with spec.autoscaling.enabled off).",
    )
    fairness: FairnessStatus | None = Field(
        default=None,
        description="Each tenant's goodput share against its max-min fair share, and Jain's "
        "index, over recentWindowSeconds (absent before a window with goodput).",
    )
    attainment: Attainment | None = Field(
        default=None,
        description="Lifetime SLO attainment: every request since the serving pods started.",
    )
    recent_attainment: Attainment | None = Field(
        default=None,
        description="SLO attainment over the last spec.reporting.attainmentWindowSeconds "
        "(the Attainment column): shows the effect of tuning p or f within that window.",
    )
    recent_window_seconds: float | None = Field(
        default=None,
        ge=0,
        description="Seconds of history behind recentAttainment: the window, or less while "
        "the operator has watched the pods for less than that.",
    )
    recent_requests: int | None = Field(
        default=None, ge=0, description="Requests counted in recentAttainment."
    )
    goodput_tokens_per_second: float | None = Field(
        default=None, ge=0, description="Goodput tokens/s between the last two scrapes."
    )
    scraped_pods: int = Field(
        default=0, ge=0, description="Sidecar metrics endpoints read in the last scrape."
    )
    last_scrape_time: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When the sidecars were last read (RFC 3339).",
    )
