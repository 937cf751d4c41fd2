from __future__ import annotations

from jitserve.requests import LiveRequest, Phase, Request
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
