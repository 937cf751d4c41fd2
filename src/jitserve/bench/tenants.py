"""Tenants in a bench run: each tenant's goodput share beside its demand and its max-min
fair share, and Jain's index (issue 27: f is measured against max-min shares, not an
equal split).

Demand is the goodput everything a tenant sent in the run would earn by meeting its SLO
(:func:`jitserve.goodput.goodput_if_met`: the same units as the goodput shared)
(``demand_tokens_by_tenant``); the capacity shared is the goodput the run earned; the
max-min share water-fills that capacity over the demands by weight
(:func:`jitserve.fairshare.shares_of`, as the sidecar and the SLOPolicy status do).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jitserve.fairshare import shares_of


def tenant_fairness(
    entry: dict[str, Any], weight_of: Callable[[str], float]
) -> tuple[list[dict[str, Any]], float] | None:
    """(a row per tenant: demand, max-min and goodput shares; Jain's index of goodput over
    max-min shares) of one run or summary entry; None with fewer than two tenants or no
    goodput."""
    got: dict[str, float] = entry.get("goodput_tokens_by_tenant") or {}
    demand: dict[str, float] = entry.get("demand_tokens_by_tenant") or {}
    asked = sum(demand.values())
    shares = shares_of(demand, demand, got, {t: weight_of(t) for t in demand})
    if len(demand) < 2 or asked <= 0 or shares is None:
        return None
    rows = [{"tenant": t, "demand_share": demand[t] / asked, "max_min_share": shares.max_min[t],
             "goodput_share": shares.received[t]} for t in sorted(demand)]
    return rows, shares.jain


def tenants_markdown(summary: list[dict[str, Any]], weight_of: Callable[[str], float]) -> str:
    """The tenant table of a bench run ("" when no entry has two tenants)."""
    rows = ["| scenario | load | policy | tenant | demand | max-min share | goodput share "
            "| Jain's index |", "|---|---|---|---|---|---|---|---|"]
    for e in sorted(summary, key=lambda e: (e["scenario"], e["load"], e["policy"])):
        figures = tenant_fairness(e, weight_of)
        if figures is None:
            continue
        tenants, jain = figures
        for i, t in enumerate(tenants):
            scenario = e["scenario"] or "-"
            rows.append(f"| {scenario} | {e['load']:.2f} | {e['policy']} | {t['tenant']} "
                        f"| {t['demand_share']:.3f} | {t['max_min_share']:.3f} "
                        f"| {t['goodput_share']:.3f} | {f'{jain:.3f}' if i == 0 else ''} |")
    return "\n".join(rows) if len(rows) > 2 else ""
