"""The autoscaling settings of the ``SLOPolicy`` model: how many serving replicas jitserve's
planner (:mod:`jitserve.scaling.planner`) keeps, between which bounds, for which SLO
attainment, and how fast it moves (docs/autoscaling.md)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, model_validator

from jitserve.policy.base import Fraction, cel
from jitserve.policy.base import SpecModel as _Model
from jitserve.slo import SLOKind


class Actuator(StrEnum):
    OPERATOR = "operator"
    KEDA = "keda"


class AutoscalingSettings(_Model):
    """The planner sizes the pool from the arrival rate it forecasts one warm-up ahead,
    the replica capacity it was profiled at, and a utilization it learns from measured
    SLO attainment; it adds replicas at once and removes them one period at a time,
    draining each (no request cut)."""

    model_config = cel(
        ("self.minReplicas <= self.maxReplicas", "autoscaling.minReplicas: above maxReplicas"),
        (
            "!self.enabled || has(self.replicaCapacity)",
            "autoscaling.replicaCapacity: required when autoscaling is enabled",
        ),
    )

    enabled: bool = Field(default=False, description="The operator sizes the serving pool.")
    actuator: Actuator = Field(
        default=Actuator.OPERATOR,
        description="operator: the operator writes the planner's count to spec.replicas; "
        "keda: it only exports it (jitserve_operator_autoscaler_desired_replicas) for a KEDA "
        "ScaledObject (the chart's keda section) or an HPA to apply.",
    )
    min_replicas: int = Field(default=1, ge=0, le=10000, description="Fewest replicas.")
    max_replicas: int = Field(default=8, ge=1, le=10000, description="Most replicas.")
    target_attainment: Fraction = Field(
        default=0.95,
        description="SLO attainment (share of requests and programs that meet their SLO) "
        "every kind must hold; the planner adds replicas when one falls below it.",
    )
    target_by_kind: dict[SLOKind, Fraction] = Field(
        default_factory=dict,
        description="A kind's own target (latency, deadline, compound) instead of "
        "targetAttainment.",
    )
    period_seconds: float = Field(
        default=15.0, gt=0, le=3600, description="Seconds between sizing decisions."
    )
    warmup_seconds: float = Field(
        default=60.0, ge=0, le=3600,
        description="Seconds from a new replica's creation to its first request (model load): "
        "the planner forecasts the arrival rate this far ahead.",
    )
    trend_seconds: float = Field(
        default=120.0, gt=0, le=86400,
        description="Seconds of arrival rates the forecast's trend is fitted on.",
    )
    scale_down_stabilization_seconds: float = Field(
        default=60.0, ge=0, le=86400,
        description="A removal needs every recommendation of these last seconds to agree "
        "(the highest one wins, as a HorizontalPodAutoscaler's scale-down window).",
    )
    replica_capacity: float | None = Field(
        default=None, gt=0, le=1e6,
        description="Requests per second one replica sustains saturated on this traffic "
        "(`jitserve bench` prints it for a profile: 'capacity: ... work items/s'); the "
        "planner sizes the pool from it at the learned utilization.",
    )
    utilization: float = Field(
        default=0.7, gt=0, le=1,
        description="Starting share of a replica's profiled capacity the planner fills; it "
        "falls while attainment misses its target and rises while it holds at that load.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSettings:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"minReplicas ({self.min_replicas}) is above maxReplicas ({self.max_replicas})"
            )
        if self.enabled and self.replica_capacity is None:
            raise ValueError("replicaCapacity: required when autoscaling is enabled")
        return self

    def target(self, kind: SLOKind) -> float:
        return self.target_by_kind.get(kind, self.target_attainment)
