"""Max-min fair shares and Jain's index: what fairness is measured against (issue 27).

A tenant's fair share is not an equal split: at load 1.0, where the engine serves almost
everything, "a third each" would take service from a tenant nobody else wants. The share
that means something is max-min (water-filling): capacity is poured over the tenants by
weight, a tenant that asks for less than its weighted level gets what it asks, and what
it leaves is poured over the rest. Jain's index over the tenants' received / fair ratios
summarises how close the service came: 1 when every tenant got its share in proportion,
1/n when one tenant got everything.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


def max_min_shares(
    demand: Mapping[str, float], weights: Mapping[str, float], capacity: float
) -> dict[str, float]:
    """Each tenant's weighted max-min fair allocation of ``capacity`` (same units as
    ``demand``; a tenant missing from ``weights`` weighs 1). The allocations sum to
    ``min(capacity, total demand)``."""
    left = max(capacity, 0.0)
    pending = sorted(demand, key=lambda t: max(demand[t], 0.0) / weights.get(t, 1.0))
    weight_left = sum(weights.get(t, 1.0) for t in pending)
    out: dict[str, float] = {}
    for i, tenant in enumerate(pending):
        weight = weights.get(tenant, 1.0)
        level = left / weight_left if weight_left > 0 else 0.0
        wanted = max(demand[tenant], 0.0)
        if wanted <= level * weight:
            out[tenant] = wanted
        else:  # this tenant and every later one (asking more per weight) get the level
            for rest in pending[i:]:
                out[rest] = level * weights.get(rest, 1.0)
            break
        left -= wanted
        weight_left -= weight
    return out


def fair_allocation(
    tenants: Iterable[str], demand: Mapping[str, float], received: Mapping[str, float],
    weights: Mapping[str, float],
) -> tuple[dict[str, float], float] | None:
    """(Each tenant's max-min fair allocation, the total) of the service ``tenants``
    received together: their ``demand`` water-filled by weight over that total, a
    tenant's demand taken as at least what it received (service admitted before the
    books opened was asked for too). None when they received nothing."""
    live = sorted(set(tenants))  # a fixed order of the float sums, not the hash seed's
    total = sum(received.get(t, 0.0) for t in live)
    if total <= 0:
        return None
    wanted = {t: max(demand.get(t, 0.0), received.get(t, 0.0)) for t in live}
    return max_min_shares(wanted, weights, total), total


@dataclass(frozen=True, slots=True)
class Shares:
    """What the tenants got against their max-min fair shares: each one's fair share and
    received share of the ``total`` service (ratios), and Jain's index over received / fair."""

    max_min: dict[str, float]
    received: dict[str, float]
    jain: float
    total: float


def shares_of(
    tenants: Iterable[str], demand: Mapping[str, float], received: Mapping[str, float],
    weights: Mapping[str, float],
) -> Shares | None:
    """The tenants' :class:`Shares` of what they received together, their demand
    water-filled by weight (:func:`fair_allocation`); None when they received nothing.
    What the sidecar's gauges, the SLOPolicy status and the bench report."""
    allocation = fair_allocation(tenants, demand, received, weights)
    if allocation is None:
        return None
    fair, total = allocation
    got = {t: received.get(t, 0.0) for t in fair}
    jain = jain_index(got[t] / fair[t] for t in fair if fair[t] > 0)
    return Shares({t: fair[t] / total for t in fair}, {t: got[t] / total for t in fair}, jain,
                  total)


def fair_claims(
    tenants: Iterable[str], received: Mapping[str, float], weights: Mapping[str, float],
    demand: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Each tenant's claim on the service in [0, 1]: ``share / (share + got)``, ``got``
    its share of what ``tenants`` received and ``share`` its max-min fair share of it
    (:func:`fair_allocation`; without ``demand``, or before any service, its weight over
    the tenants' weights). A tenant at its fair share claims 1/2, one that received
    nothing 1, one that asked for nothing 0."""
    live = sorted(set(tenants))
    total = sum(received.get(t, 0.0) for t in live)
    weight_sum = sum(weights[t] for t in live) or 1.0
    fair = fair_allocation(live, demand, received, weights) if demand is not None else None
    claims = {}
    for t in live:
        share = fair[0][t] / total if fair is not None else weights[t] / weight_sum
        got = received.get(t, 0.0) / total if total > 0 else share
        claims[t] = share / (share + got) if share > 0 else 0.0
    return claims


def jain_index(ratios: Iterable[float]) -> float:
    """Jain's fairness index of ``ratios`` (each tenant's received over fair share):
    ``(sum x)^2 / (n * sum x^2)``, in ``[1/n, 1]``; 1 for no tenant (nothing to be unfair
    about) or all zeros."""
    xs = [max(x, 0.0) for x in ratios]
    squares = sum(x * x for x in xs)
    if not xs or squares == 0:
        return 1.0
    return sum(xs) ** 2 / (len(xs) * squares)


class DecayedBooks:
    """Each tenant's demand (``asked``: the goodput its arrivals would earn by meeting
    their SLOs, :func:`jitserve.goodput.goodput_if_met`) and the service it was given
    (``served``: the same for the requests it started, credited at their start), both
    decayed with the time constant ``window_s``: what a scheduler's claims are computed
    from (:func:`fair_claims`).

    Service is credited when it is given, not when its goodput lands (as a virtual token
    counter credits tokens as they are served): a program's goodput lands at its end,
    tens of seconds after its calls took the engine, and claims fed by it lagged the
    service they were to steer (docs/scheduling.md "f against max-min fair shares")."""

    def __init__(self) -> None:
        self.asked: dict[str, float] = defaultdict(float)
        self.served: dict[str, float] = defaultdict(float)
        self._last_s: float | None = None

    def decay(self, now_s: float, window_s: float) -> None:
        if self._last_s is not None:
            d = math.exp(-(now_s - self._last_s) / window_s)
            for book in (self.served, self.asked):
                for t in book:
                    book[t] *= d
        self._last_s = now_s

    def claims(self, tenants: Iterable[str], weights: Mapping[str, float]) -> dict[str, float]:
        return fair_claims(tenants, self.served, weights, self.asked)
