"""Prometheus metrics of the operator itself (``jitserve operator --metrics-port``).

- ``jitserve_operator_reconciles_total{result}``: ok | invalid (spec problems) | error
  (apply failures); ``jitserve_operator_reconcile_seconds``: time per reconcile;
- ``jitserve_operator_writes_total{kind,verb}``: child writes (create | apply | patch |
  delete): a steady state writes nothing, so a rate here means drift or churn;
- ``jitserve_operator_scrape_failures_total``: sidecar ``/metrics`` reads that failed;
- ``jitserve_operator_admission_reviews_total{operation,result}``: webhook answers,
  result allowed | denied;
- per policy: ``jitserve_operator_policy_ready``, ``jitserve_operator_policy_degraded``
  (0/1), ``jitserve_operator_policy_attainment{window}`` (recent | lifetime) and
  ``jitserve_operator_autoscaler_desired_replicas`` (the planner's count, with
  ``spec.autoscaling``), the figures of the policy's status, labelled ``namespace`` and
  ``policy``.
"""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_RECONCILE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class OperatorMetrics:
    """The operator's metric families, on their own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry or CollectorRegistry()
        self.registry = r
        self.reconciles = Counter(
            "jitserve_operator_reconciles", "Reconciles by result.", ["result"], registry=r
        )
        self.reconcile_seconds = Histogram(
            "jitserve_operator_reconcile_seconds",
            "Time per reconcile (children, status, scrape).",
            buckets=_RECONCILE_BUCKETS,
            registry=r,
        )
        self.writes = Counter(
            "jitserve_operator_writes", "Child object writes.", ["kind", "verb"], registry=r
        )
        self.scrape_failures = Counter(
            "jitserve_operator_scrape_failures",
            "Sidecar /metrics reads that failed.",
            registry=r,
        )
        self.admissions = Counter(
            "jitserve_operator_admission_reviews",
            "Validating webhook answers.",
            ["operation", "result"],
            registry=r,
        )
        per_policy = ["namespace", "policy"]
        self.ready = Gauge(
            "jitserve_operator_policy_ready", "1 when the policy is Ready.", per_policy, registry=r
        )
        self.degraded = Gauge(
            "jitserve_operator_policy_degraded",
            "1 when the policy is Degraded (invalid spec, apply failure).",
            per_policy,
            registry=r,
        )
        self.attainment = Gauge(
            "jitserve_operator_policy_attainment",
            "Overall SLO attainment in the policy's status (window: recent or lifetime).",
            [*per_policy, "window"],
            registry=r,
        )
        self.desired_replicas = Gauge(
            "jitserve_operator_autoscaler_desired_replicas",
            "The planner's replica count for the policy (spec.autoscaling; what a KEDA "
            "ScaledObject applies with actuator: keda).",
            per_policy,
            registry=r,
        )

    def observe_status(self, namespace: str, policy: str, status: dict[str, Any]) -> None:
        """Mirror a policy's status into the per-policy gauges."""
        conds = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        self.ready.labels(namespace, policy).set(1 if conds.get("Ready") == "True" else 0)
        self.degraded.labels(namespace, policy).set(1 if conds.get("Degraded") == "True" else 0)
        for window, key in (("recent", "recentAttainment"), ("lifetime", "attainment")):
            value = (status.get(key) or {}).get("overall")
            if value is None:
                self._remove(self.attainment, namespace, policy, window)
            else:
                self.attainment.labels(namespace, policy, window).set(float(value))
        desired = (status.get("autoscaling") or {}).get("desiredReplicas")
        if desired is None:
            self._remove(self.desired_replicas, namespace, policy)
        else:
            self.desired_replicas.labels(namespace, policy).set(float(desired))

    def forget(self, namespace: str, policy: str) -> None:
        """Drop a deleted policy's series."""
        self._remove(self.ready, namespace, policy)
        self._remove(self.degraded, namespace, policy)
        for window in ("recent", "lifetime"):
            self._remove(self.attainment, namespace, policy, window)
        self._remove(self.desired_replicas, namespace, policy)

    @staticmethod
    def _remove(gauge: Gauge, *labels: str) -> None:
        with contextlib.suppress(KeyError):
            gauge.remove(*labels)
