"""Tenants in a bench run: each tenant's goodput share beside its demand and its max-min
fair share, and Jain's index (issue 27: f is measured against max-min shares, not an
equal split).

Demand is the goodput everything a tenant sent in the run would earn by meeting its SLO
(:func:`jitserve.goodput.goodput_if_met`: the same units as the goodput shared)
(``demand_tokens_by_tenant``); the capacity shared is the goodput the run earned; the
max-min share water-fills that capacity over the demands by weight
(:func:`jitserve.fairshare.max_min_shares`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jitserve.fairshare import jain_index, max_min_shares


def tenant_fairness(
    entry: dict[str, Any], weight_of: Callable[[str], float]
) -> tuple[list[dict[str, Any]], float] | None:
    """(a row per tenant: demand, max-min and goodput shares; Jain's index of goodput over
    max-min shares) of one run or summary entry; None with fewer than two tenants or no
    goodput."""
    got: dict[str, float] = entry.get("goodput_tokens_by_tenant") or {}
    demand: dict[str, float] = entry.get("demand_tokens_by_tenant") or {}
    total, asked = sum(got.values()), sum(demand.values())
    if len(demand) < 2 or total <= 0 or asked <= 0:
        return None
    fair = max_min_shares(demand, {t: weight_of(t) for t in demand}, total)
    rows = [{"tenant": t, "demand_share": demand[t] / asked, "max_min_share": fair[t] / total,
             "goodput_share": got.get(t, 0.0) / total} for t in sorted(demand)]
    return rows, jain_index(got.get(t, 0.0) / fair[t] for t in demand if fair[t] > 0)


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
