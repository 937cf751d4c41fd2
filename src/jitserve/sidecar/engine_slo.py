"""The SLO a dispatch carries to vLLM for jitserve's in-engine scheduler (owner: sidecar).

vLLM forwards a request's ``vllm_xargs`` to its scheduler as ``sampling_params.extra_args``;
:mod:`jitserve.engine` reads the due time of the dispatch's first token (wall clock: vLLM
is another process) and the TBT target from them (keys in :mod:`jitserve.engine.wire`).
A resumed dispatch is due where the request's own token ``done`` is; a request with no
per-token target sends TBT 0, so its decodes never shrink the engine's budget.
"""

from __future__ import annotations

from jitserve.engine.wire import DUE_ARG, TBT_ARG
from jitserve.requests import LiveRequest
from jitserve.slo import LatencySLO


def engine_xargs(live: LiveRequest, done: int, now: float, wall_now: float) -> dict[str, float]:
    """``vllm_xargs`` for a dispatch of ``live`` after ``done`` tokens, at sidecar time
    ``now`` (wall clock ``wall_now``)."""
    slo = live.req.slo
    if isinstance(slo, LatencySLO):
        due, tbt = slo.due_s(live.req.arrival_s, done), slo.tbt_s
    else:
        due, tbt = live.deadline_abs_s, 0.0
    return {DUE_ARG: wall_now + (due - now), TBT_ARG: tbt}
