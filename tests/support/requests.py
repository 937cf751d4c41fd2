from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jitserve.requests import LiveRequest, Phase, Request
from jitserve.scheduling.gmax.grouping import GroupCut, choose_by_context
from jitserve.slo import SLO, DeadlineSLO


def live(
    rid: str,
    *,
    arrival: float = 0.0,
    prompt: int = 100,
    output: int = 100,
    slo: SLO | None = None,
    tenant: str = "t",
    bound: int | None = None,
    generated: int = 0,
    running: bool = False,
) -> LiveRequest:
    req = Request(rid, tenant, slo or DeadlineSLO(20.0), prompt, arrival, output_tokens=output)
    r = LiveRequest(req)
    r.bound = bound if bound is not None else output
    r.expected = float(r.bound)
    r.generated = generated
    if running:
        r.phase = Phase.RUNNING
        r.prefilled = r.prefill_target
        r.started_s = arrival
    return r


def choose_group(live_requests: Sequence[LiveRequest], priority: np.ndarray, batch: int,
                 cutoff: float | None, candidate_factor: int,
                 length_window: bool = True) -> tuple[np.ndarray, float]:
    """GMAX's group choice over the requests' context lengths, as the waiting table feeds
    :func:`~jitserve.scheduling.gmax.grouping.choose_by_context` its column."""
    context = np.array([r.context_tokens for r in live_requests], dtype=np.float64)
    cut = GroupCut(batch, cutoff, candidate_factor, length_window)
    return choose_by_context(context, priority, cut)
