"""The shared overload layer judges "unreachable" at unloaded speed for every kind and
keeps preempted requests under the max-wait rule (issue 16)."""

from __future__ import annotations

import pytest

from jitserve.policy import SLOPolicySpec, load_policy
from jitserve.scheduling.base import EngineView, FramePlan
from jitserve.scheduling.baselines import EDF
from jitserve.scheduling.overload import OverloadControl
from jitserve.slo import DeadlineSLO, LatencySLO
from tests.support.policies import Spy
from tests.support.requests import live


def view(now: float, prefill_s: float, decode_s: float = 0.03, batch: int = 8) -> EngineView:
    return EngineView(now, batch, [], decode_s, prefill_s, prefill_s)


def retired(plan: FramePlan) -> list[tuple[str, str]]:
    return sorted((x.request.req.request_id, x.reason.value) for x in plan.retire)


def test_unreachable_is_judged_at_the_fastest_measured_speed_not_the_loaded_one() -> None:
    layer = Spy(SLOPolicySpec(), OverloadControl())
    layer.frame(view(0.0, prefill_s=1e-4))  # idle: the unloaded speed
    # 20k prompt tokens: 2 s unloaded, 20 s at the loaded 1e-3 s a token; deadline 10 s
    big = live("big", arrival=1.0, prompt=20000, slo=DeadlineSLO(10))
    layer.enqueue(big, 1.0)
    assert layer.frame(view(2.0, prefill_s=1e-3)).retire == []
    assert retired(layer.frame(view(9.5, prefill_s=1e-3))) == [("big", "unreachable")]


@pytest.mark.parametrize("objective", ["tokens", "requests"])
def test_a_latency_request_whose_first_token_cannot_be_on_time_is_unreachable(
    objective: str,
) -> None:
    layer = Spy(load_policy({"objective": objective}), OverloadControl())
    # TTFT 0.5 s; at 1e-4 s a token the 50k prompt alone takes 5 s
    doomed = live("doomed", arrival=0.0, prompt=50000, slo=LatencySLO(0.5, 0.1))
    fine = live("fine", arrival=0.0, prompt=100, slo=LatencySLO(0.5, 0.1))
    started = live("started", arrival=0.0, prompt=50000, slo=LatencySLO(0.5, 0.1))
    started.first_token_s = 0.4  # a stream that has begun is never cut
    for r in (doomed, fine, started):
        layer.enqueue(r, 0.0)
    assert retired(layer.frame(view(0.1, prefill_s=1e-4))) == [("doomed", "unreachable")]


def test_preempted_requests_fall_under_the_max_wait_rule() -> None:
    spec = load_policy({"admission": {"maxWaitingSeconds": 5}})
    layer = EDF(spec, OverloadControl())
    preempted = live("preempted", arrival=0.0, slo=DeadlineSLO(1000))
    preempted.started_s = 1.0
    recent = live("recent", arrival=0.0, slo=DeadlineSLO(1000))
    recent.started_s = 1.0
    layer.enqueue(preempted, 2.0)  # back in the queue at 2 s
    layer.enqueue(recent, 8.0)  # back at 8 s: waited 2 s by 10 s
    busy = live("busy", arrival=0.0, slo=DeadlineSLO(1000), running=True)
    plan = layer.frame(EngineView(10.0, 1, [busy], 0.03, 1e-4, 1e-4))
    assert retired(plan) == [("preempted", "max_waiting")]
