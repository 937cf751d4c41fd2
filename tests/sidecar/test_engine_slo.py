"""The SLO each dispatch carries to vLLM's in-engine scheduler (sidecar.engine_slo)."""

from __future__ import annotations

from jitserve.engine.wire import DUE_ARG, TBT_ARG
from jitserve.requests import LiveRequest, Request
from jitserve.sidecar.engine_slo import engine_xargs
from jitserve.slo import DeadlineSLO, LatencySLO


def test_a_latency_dispatch_is_due_where_its_next_token_is_on_the_wall_clock() -> None:
    live = LiveRequest(Request("r", "t", LatencySLO(ttft_s=2.0, tbt_s=0.1), 10, arrival_s=50.0))
    # token 5 of the request is due at 50 + 2 + 5 * 0.1 = 52.5 sidecar time, 1.5 s from now
    xargs = engine_xargs(live, done=5, now=51.0, wall_now=1_700_000_000.0)
    assert abs(xargs[DUE_ARG] - 1_700_000_001.5) < 1e-6 and xargs[TBT_ARG] == 0.1


def test_a_deadline_request_is_never_protected_per_token() -> None:
    live = LiveRequest(Request("r", "t", DeadlineSLO(deadline_s=30.0), 10, arrival_s=0.0))
    xargs = engine_xargs(live, done=0, now=1.0, wall_now=100.0)
    assert xargs[TBT_ARG] == 0.0 and xargs[DUE_ARG] == 129.0
