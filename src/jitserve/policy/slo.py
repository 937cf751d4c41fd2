"""The ``sloDefaults`` section of the ``SLOPolicy`` model: the SLO every request gets.

Part of the ``SLOPolicy`` model (:mod:`jitserve.policy` imports these and is their public
face): the per-kind defaults of requests that carry no SLO (latency TTFT/TBT, deadline,
compound seconds per stage, the best-effort deadline), and the named SLO classes requests
and tenants ask for by name; :meth:`SLODefaults.slo_for` and :meth:`SLODefaults.class_slo`
turn them into :mod:`jitserve.slo` values. Cross-field rules are CEL
``x-kubernetes-validations`` (:func:`~jitserve.policy.base.cel`) with the same rule in
Python next to each.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from jitserve.policy.base import DNSLabel, Seconds, cel
from jitserve.policy.base import SpecModel as _Model
from jitserve.slo import SLO, CompoundSLO, DeadlineSLO, LatencySLO, SLOKind


class LatencyDefaults(_Model):
    ttft_seconds: Seconds = Field(
        default=2.0, description="Time to first token target (paper: P95 of real API calls)."
    )
    tbt_seconds: Seconds = Field(default=0.1, description="Time between tokens target.")


class SLOClass(_Model):
    """A named SLO class tenants can ask for (e.g. ``interactive``, ``batch``)."""

    model_config = cel(
        (
            "self.kind != 'latency' || (has(self.ttftSeconds) && has(self.tbtSeconds))",
            "kind latency needs ttftSeconds and tbtSeconds",
        ),
        (
            "!(self.kind in ['deadline', 'compound']) || has(self.deadlineSeconds)",
            "kind deadline and compound need deadlineSeconds",
        ),
    )

    name: DNSLabel = Field(description="Class name requests ask for (slo.class, x-slo-class).")
    kind: SLOKind = Field(description="latency, deadline, compound or best_effort.")
    ttft_seconds: Seconds | None = Field(default=None, description="TTFT target (latency).")
    tbt_seconds: Seconds | None = Field(default=None, description="TBT target (latency).")
    deadline_seconds: Seconds | None = Field(
        default=None, description="End-to-end deadline (deadline), whole program (compound)."
    )

    @model_validator(mode="after")
    def _fields_match_kind(self) -> SLOClass:
        if self.kind is SLOKind.LATENCY and (self.ttft_seconds is None or self.tbt_seconds is None):
            raise ValueError(f"class {self.name}: kind latency needs ttftSeconds and tbtSeconds")
        if self.kind in (SLOKind.DEADLINE, SLOKind.COMPOUND) and self.deadline_seconds is None:
            raise ValueError(f"class {self.name}: kind {self.kind.value} needs deadlineSeconds")
        return self


class SLODefaults(_Model):
    """SLOs of requests that carry none, and named SLO classes."""

    model_config = cel(
        (
            "!has(self.defaultClass) || self.classes.exists(c, c.name == self.defaultClass)",
            "sloDefaults.defaultClass: not in sloDefaults.classes",
        ),
    )

    latency: LatencyDefaults = Field(
        default=LatencyDefaults(), description="Defaults of latency requests (TTFT, TBT)."
    )
    deadline_seconds: Seconds = Field(
        default=20.0, description="End-to-end latency target of deadline requests."
    )
    compound_seconds_per_stage: Seconds = Field(
        default=20.0, description="Compound deadline = this x number of stages."
    )
    best_effort_deadline_seconds: Seconds = Field(
        default=120.0,
        description="Deadline given to requests without an SLO, so they never starve.",
    )
    classes: list[SLOClass] = Field(
        default_factory=list, max_length=64, description="Named SLO classes requests can ask for."
    )
    default_class: DNSLabel | None = Field(
        default=None,
        description=(
            "SLO class of requests that carry no SLO fields (a tenant's own defaultClass wins);"
            " none: best effort with bestEffortDeadlineSeconds."
        ),
    )

    def unspecified_class(self, tenant_default: str | None) -> str | None:
        """The class of a request without SLO fields: the tenant's, else the policy's."""
        return tenant_default or self.default_class

    def slo_for(self, kind: SLOKind, stages: int = 1) -> SLO:
        """The default SLO of ``kind``."""
        if kind is SLOKind.LATENCY:
            return LatencySLO(self.latency.ttft_seconds, self.latency.tbt_seconds)
        if kind is SLOKind.DEADLINE:
            return DeadlineSLO(self.deadline_seconds)
        if kind is SLOKind.COMPOUND:
            return CompoundSLO(self.compound_seconds_per_stage * stages)
        return DeadlineSLO(self.best_effort_deadline_seconds, best_effort=True)

    def class_slo(self, name: str) -> SLO | None:
        for cls in self.classes:
            if cls.name == name:
                if cls.kind is SLOKind.LATENCY:
                    assert cls.ttft_seconds is not None and cls.tbt_seconds is not None
                    return LatencySLO(cls.ttft_seconds, cls.tbt_seconds)
                if cls.kind is SLOKind.BEST_EFFORT:
                    return self.slo_for(SLOKind.BEST_EFFORT)
                assert cls.deadline_seconds is not None
                if cls.kind is SLOKind.COMPOUND:
                    return CompoundSLO(cls.deadline_seconds)
                return DeadlineSLO(cls.deadline_seconds)
        return None
