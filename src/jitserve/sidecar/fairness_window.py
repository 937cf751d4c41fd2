"""Each tenant's share of goodput against its max-min fair share, over the fairness
window (issue 27; owner: sidecar).

What f is measured against is not an equal split but max-min: each tenant's demand (the
goodput its admitted requests would earn by meeting their SLOs, in the units of the
goodput it is a share of: a latency request's max_tokens, any other's prompt +
max_tokens; :func:`jitserve.goodput.goodput_if_met`) over the window, the goodput earned
in the window as the capacity, water-filled by the tenants' weights
(:func:`jitserve.fairshare.shares_of`). At scrape, per tenant (the metrics' bounded
tenant label): ``jitserve_tenant_max_min_share`` and ``jitserve_tenant_goodput_share``
(ratios of the window's goodput), and ``jitserve_fairness_jain_index`` over the
received / fair ratios. Nothing is emitted for a window without goodput. The demand
itself is a counter, ``jitserve_tenant_demand_tokens_total{tenant}``, from which the
operator computes the same figures fleet-wide over its own window (beside
``jitserve_goodput_tokens_total``).
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from jitserve.fairshare import shares_of
from jitserve.policy import FairnessSettings


class FairnessWindow(Collector):
    def __init__(self, label: Callable[[str], str],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label = label
        self.clock = clock
        self.settings = FairnessSettings()
        """The policy's fairness section (weights, window), replaced on reload."""
        self._asked: deque[tuple[float, str, float]] = deque()
        self._earned: deque[tuple[float, str, float]] = deque()
        self._asked_total: dict[str, float] = defaultdict(float)

    def asked(self, tenant: str, tokens: float) -> None:
        """A request of ``tenant`` that would earn ``tokens`` of goodput was admitted."""
        self._asked.append((self.clock(), tenant, tokens))
        self._asked_total[self.label(tenant)] += tokens

    def earned(self, tenant: str, goodput_tokens: float) -> None:
        if goodput_tokens:
            self._earned.append((self.clock(), tenant, goodput_tokens))

    def shares(self) -> tuple[dict[str, float], dict[str, float], float] | None:
        """(max-min share, goodput share) per tenant label and Jain's index over the
        window; None when it earned nothing."""
        oldest = self.clock() - self.settings.window_seconds
        demand: dict[str, float] = defaultdict(float)
        received: dict[str, float] = defaultdict(float)
        for log, into in ((self._asked, demand), (self._earned, received)):
            while log and log[0][0] < oldest:
                log.popleft()
            for _, tenant, tokens in log:
                into[tenant] += tokens
        tenants = set(demand) | set(received)
        weights = {t: self.settings.weight_of(t) for t in tenants}
        shares = shares_of(tenants, demand, received, weights)
        if shares is None:
            return None
        fair_by: dict[str, float] = defaultdict(float)
        got_by: dict[str, float] = defaultdict(float)
        for tenant in shares.max_min:
            fair_by[self.label(tenant)] += shares.max_min[tenant]
            got_by[self.label(tenant)] += shares.received[tenant]
        return dict(fair_by), dict(got_by), shares.jain

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        demand = CounterMetricFamily(
            "jitserve_tenant_demand_tokens", "The goodput the tenant's admitted requests would "
            "earn by meeting their SLOs (a latency request: max_tokens; others: prompt + "
            "max_tokens): its demand, what its max-min fair share is water-filled from.",
            labels=["tenant"])
        for tenant, tokens in sorted(self._asked_total.items()):
            demand.add_metric([tenant], tokens)
        yield demand
        window = f"{self.settings.window_seconds:g} s"
        fair = GaugeMetricFamily(
            "jitserve_tenant_max_min_share", f"Each tenant's max-min fair share of the goodput "
            f"earned in the last {window} (its demand water-filled by weight), a ratio.",
            labels=["tenant"])
        got = GaugeMetricFamily(
            "jitserve_tenant_goodput_share",
            f"Each tenant's share of the goodput earned in the last {window}, a ratio.",
            labels=["tenant"])
        jain = GaugeMetricFamily(
            "jitserve_fairness_jain_index", f"Jain's index of the tenants' goodput over "
            f"their max-min shares in the last {window} (1: every tenant its share).")
        figures = self.shares()
        if figures is not None:
            fair_by, got_by, index = figures
            for tenant in sorted(fair_by):
                fair.add_metric([tenant], fair_by[tenant])
                got.add_metric([tenant], got_by[tenant])
            jain.add_metric([], index)
        yield fair
        yield got
        yield jain
