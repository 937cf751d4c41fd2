"""What the sidecars' ``/metrics`` say, for an SLOPolicy's status (pure; owner: operator).

The sidecar metrics contract (:mod:`jitserve.sidecar.metrics` writes it):

- ``jitserve_requests_total{tenant,kind,slo_class,outcome}``, outcome in
  met|missed|retired|cancelled|error;
- ``jitserve_goodput_tokens_total{tenant,kind,slo_class}``: goodput tokens, a counter;
- ``jitserve_effective_cutoff``: the ``p`` the sidecar's scheduler uses now;
  ``jitserve_fairness_weight``: the f it uses now;
- ``jitserve_policy_in_effect{policy}`` and ``jitserve_policy_in_effect_since_seconds``:
  the scheduler that runs now (with ``scheduler.policy: auto``, the tuner's choice) and
  since when;
- ``jitserve_tenant_demand_tokens_total{tenant}``: the goodput the tenant's admitted
  requests would earn by meeting their SLOs (with goodput by tenant: ``status.fairness``,
  :mod:`~jitserve.operator.fairness_status`);
- ``jitserve_arrivals_total{kind}`` and ``jitserve_queue_depth``: the demand and the
  queue the autoscaler sizes for (:mod:`~jitserve.operator.autoscaler`).

Counters grow from a pod's start: rates and recent windows come from two scrapes
(:func:`goodput_rate`, :class:`OutcomeHistory`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from prometheus_client.parser import text_string_to_metric_families

K = TypeVar("K")

DEMAND, GOODPUT = "demand", "goodput"  # a sample's per-tenant token counters


@dataclass
class SidecarSample:
    """What one sidecar's ``/metrics`` said."""

    outcomes: dict[tuple[str, str], float] = field(default_factory=dict)  # (kind, outcome) -> count
    goodput_tokens: float = 0.0
    effective_cutoff: float | None = None
    fairness_weight: float | None = None
    tenants: dict[tuple[str, str], float] = field(default_factory=dict)
    """(tenant, DEMAND | GOODPUT) -> tokens, the counters' totals."""
    policy_in_effect: str | None = None
    policy_since_s: float | None = None
    """Unix time the scheduler in effect started."""
    arrivals: dict[str, float] = field(default_factory=dict)
    """Valid requests received, by kind (the autoscaler's demand)."""
    queue_depth: float = 0.0
    running: float = 0.0


def parse_metrics(text: str) -> SidecarSample:
    """Parse a Prometheus text exposition into the figures the status needs."""
    sample = SidecarSample()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "jitserve_requests_total":
                key = (s.labels.get("kind", ""), s.labels.get("outcome", ""))
                sample.outcomes[key] = sample.outcomes.get(key, 0.0) + float(s.value)
            elif s.name == "jitserve_goodput_tokens_total":
                sample.goodput_tokens += float(s.value)
                _add(sample.tenants, (s.labels.get("tenant", ""), GOODPUT), float(s.value))
            elif s.name == "jitserve_tenant_demand_tokens_total":
                _add(sample.tenants, (s.labels.get("tenant", ""), DEMAND), float(s.value))
            elif s.name == "jitserve_effective_cutoff":
                sample.effective_cutoff = float(s.value)
            elif s.name == "jitserve_fairness_weight":
                sample.fairness_weight = float(s.value)
            elif s.name == "jitserve_policy_in_effect" and s.value == 1:
                sample.policy_in_effect = s.labels.get("policy")
            elif s.name == "jitserve_policy_in_effect_since_seconds":
                sample.policy_since_s = float(s.value)
            elif s.name == "jitserve_arrivals_total":
                kind = s.labels.get("kind", "")
                sample.arrivals[kind] = sample.arrivals.get(kind, 0.0) + float(s.value)
            elif s.name == "jitserve_queue_depth":
                sample.queue_depth = float(s.value)
            elif s.name == "jitserve_running_requests":
                sample.running = float(s.value)
    return sample


def _add(into: dict[tuple[str, str], float], key: tuple[str, str], value: float) -> None:
    into[key] = into.get(key, 0.0) + value


Outcomes = dict[tuple[str, str], float]  # (kind, outcome) -> count; also (tenant, what)


def goodput_rate(
    previous: Mapping[str, tuple[float, float]], current: Mapping[str, tuple[float, float]]
) -> float | None:
    """Goodput tokens/s summed over sidecars, from two scrapes ``target -> (time, total)``.

    A target seen only once contributes nothing; a counter that went down (pod restart)
    counts from zero.
    """
    rate = 0.0
    seen = False
    for target, (t1, v1) in current.items():
        if target not in previous:
            continue
        t0, v0 = previous[target]
        if t1 <= t0:
            continue
        seen = True
        rate += increase({target: v1}, {target: v0})[target] / (t1 - t0)
    return round(rate, 3) if seen else None


def increase(now: Mapping[K, float], before: Mapping[K, float]) -> dict[K, float]:
    """How much each counter grew since ``before``: the sidecars' counters only grow, so
    one that went down means the pod restarted, and counts from zero."""
    if any(v < before.get(k, 0.0) for k, v in now.items()):
        before = {}
    return {k: v - before.get(k, 0.0) for k, v in now.items()}


@dataclass
class OutcomeHistory:
    """Counters per scrape target over time (outcomes, or tenants' tokens), for their
    totals over a recent window.

    The sidecars' counters only grow (they count since the pod started), so the requests
    of the last ``window`` seconds are the difference between the newest scrape and the
    newest one at least ``window`` old (or the oldest kept, while the history is younger).
    A target first seen later is counted from its first scrape; a counter that went down
    (pod restart) counts from zero.
    """

    snapshots: list[tuple[float, dict[str, Outcomes]]] = field(default_factory=list)

    def add(self, t: float, per_target: Mapping[str, Outcomes], window_s: float) -> None:
        self.snapshots.append((t, {k: dict(v) for k, v in per_target.items()}))
        # Keep the newest snapshot that is at least `window_s` old (the baseline) and later.
        old = [i for i, (ts, _) in enumerate(self.snapshots) if ts <= t - window_s]
        if old:
            del self.snapshots[: old[-1]]

    def recent(self) -> tuple[Outcomes, float]:
        """Outcome counts since the baseline, summed over targets, and the span covered."""
        if len(self.snapshots) < 2:
            return {}, 0.0
        (t0, base), (t1, now) = self.snapshots[0], self.snapshots[-1]
        totals: Outcomes = {}
        for target, counts in now.items():
            first = base.get(target)
            if first is None:  # first seen after the baseline: count from its first scrape
                first = next((snap[target] for _, snap in self.snapshots if target in snap), {})
            for key, grown in increase(counts, first).items():
                totals[key] = totals.get(key, 0.0) + grown
        return totals, t1 - t0
