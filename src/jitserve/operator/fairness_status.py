"""``status.fairness`` of an SLOPolicy: each tenant's goodput share against its max-min
fair share, fleet-wide, over the recent window (issue 27; pure).

The sidecars count, per tenant label, the goodput their admitted requests would earn by
meeting their SLOs (``jitserve_tenant_demand_tokens_total``) and the goodput they earned
(``jitserve_goodput_tokens_total``). The operator keeps both per pod across scrapes, as
it keeps the outcome counters (:class:`~jitserve.operator.sidecar_metrics.OutcomeHistory`), so the
window's figures are differences of counters summed over the pods: demand water-filled
by the policy's weights over the goodput the fleet earned
(:func:`jitserve.fairshare.shares_of`, as each sidecar computes it).
"""

from __future__ import annotations

from collections.abc import Mapping

from jitserve.fairshare import shares_of
from jitserve.operator.sidecar_metrics import DEMAND, GOODPUT
from jitserve.policy import FairnessSettings, FairnessStatus, TenantShare


def fairness_status(
    totals: Mapping[tuple[str, str], float],
    settings: FairnessSettings,
    weights_in_effect: list[float],
) -> FairnessStatus | None:
    """The window's fairness figures from its per-tenant token ``totals`` ((tenant,
    DEMAND or GOODPUT) -> tokens); None when the fleet earned no goodput in it.
    ``weights_in_effect``: each sidecar's f gauge."""
    demand = {t: v for (t, what), v in totals.items() if what == DEMAND}
    received = {t: v for (t, what), v in totals.items() if what == GOODPUT}
    tenants = set(demand) | set(received)
    shares = shares_of(tenants, demand, received, {t: settings.weight_of(t) for t in tenants})
    if shares is None:
        return None
    rows = [
        TenantShare(
            name=t,
            demand_tokens=round(max(demand.get(t, 0.0), 0.0)),
            goodput_tokens=round(max(received.get(t, 0.0), 0.0)),
            max_min_share=round(min(shares.max_min[t], 1.0), 4),
            goodput_share=round(min(max(shares.received[t], 0.0), 1.0), 4),
        )
        for t in sorted(shares.max_min)
    ]
    f = sum(weights_in_effect) / len(weights_in_effect) if weights_in_effect else None
    return FairnessStatus(
        weight_in_effect=None if f is None else round(f, 4),
        jain_index=round(shares.jain, 4),
        tenants=rows,
    )
