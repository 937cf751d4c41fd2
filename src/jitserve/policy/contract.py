"""What a tenant may claim: its service contract in the ``SLOPolicy`` (issue 27).

Every SLO a request carries is a claim on the scheduler's attention; taken at its word, a
tenant could shape its claims (the tightest targets, a class meant for another team) to
take service from the others. A tenant's entry in ``fairness.tenants[]`` may bound that:
``classes`` (the SLO classes it may ask for) and ``tightest`` (the tightest TTFT, TBT and
deadline it may claim). ``fairness.beyondContract`` says what happens to a claim past its
bound: ``clamp`` (served at the bound, counted) or ``refuse`` (a 403 naming the field).
Policies that set neither keep today's behaviour.
"""

from __future__ import annotations

from dataclasses import replace
from enum import StrEnum

from pydantic import Field

from jitserve.policy.base import SpecModel as _Model
from jitserve.slo import SLO, CompoundSLO, DeadlineSLO, LatencySLO


class BeyondContract(StrEnum):
    CLAMP = "clamp"
    REFUSE = "refuse"


class ClaimBounds(_Model):
    """The tightest targets a tenant may claim (absent: no bound on that target)."""

    ttft_ms: float | None = Field(default=None, gt=0, le=86_400_000,
                                  description="Tightest time to first token, ms.")
    tbt_ms: float | None = Field(default=None, gt=0, le=86_400_000,
                                 description="Tightest time between tokens, ms.")
    deadline_seconds: float | None = Field(default=None, gt=0, le=86_400,
                                           description="Tightest deadline, seconds: of a "
                                           "deadline request, and per stage of a compound "
                                           "program (as sloDefaults.compoundSecondsPerStage).")

    def deadline_bound(self, slo: SLO, stages: int) -> float | None:
        """The tightest deadline ``slo`` may claim (a program of ``stages`` stages: per
        stage); None: no bound on it."""
        if self.deadline_seconds is None or _best_effort(slo):
            return None
        return self.deadline_seconds * (max(stages, 1) if isinstance(slo, CompoundSLO) else 1)

    def beyond(self, slo: SLO, stages: int = 1) -> list[str]:
        """The request fields of ``slo`` that claim more than these bounds allow
        (``stages``: a compound program's, when known)."""
        fields = []
        if isinstance(slo, LatencySLO):
            if self.ttft_ms is not None and slo.ttft_s < self.ttft_ms / 1e3:
                fields.append("slo.ttft_ms")
            if self.tbt_ms is not None and slo.tbt_s < self.tbt_ms / 1e3:
                fields.append("slo.tbt_ms")
        elif (bound := self.deadline_bound(slo, stages)) is not None and slo.deadline_s < bound:
            fields.append("slo.deadline_s")
        return fields

    def clamp(self, slo: SLO, stages: int = 1) -> SLO:
        """``slo`` with every target at least as loose as its bound."""
        if isinstance(slo, LatencySLO):
            ttft = max(slo.ttft_s, (self.ttft_ms or 0.0) / 1e3)
            tbt = max(slo.tbt_s, (self.tbt_ms or 0.0) / 1e3)
            return LatencySLO(ttft, tbt)
        bound = self.deadline_bound(slo, stages)
        return slo if bound is None else replace(slo, deadline_s=max(slo.deadline_s, bound))


def _best_effort(slo: SLO) -> bool:
    return isinstance(slo, DeadlineSLO) and slo.best_effort
