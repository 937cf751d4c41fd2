"""SlidingServe's multi-level sorter (scheduling.slidingserve): safeguarded first, then
urgency, then shortest remaining prefill; requests past saving last."""

from __future__ import annotations

from jitserve.policy import SLOPolicySpec
from jitserve.requests import LiveRequest, Request
from jitserve.scheduling.baselines.slidingserve import SlidingServe
from jitserve.scheduling.registry import make_policy
from jitserve.slo import LatencySLO


def live(name: str, prompt: int, arrival: float) -> LiveRequest:
    return LiveRequest(Request(name, "t", LatencySLO(ttft_s=2.0, tbt_s=0.1), prompt,
                               arrival_s=arrival))


def test_levels_then_urgency_then_shortest_remaining() -> None:
    policy = SlidingServe()  # 0.1 ms per prompt token until a frame measures it
    requests = [
        live("late", 100, -3.0),  # due 1 s ago: past saving
        live("relaxed-long", 1500, 0.0),  # 0.15 s of 2 s: urgency 0.075
        live("urgent", 10000, 0.0),  # 1 s of prefill in 2 s: safeguarded
        live("relaxed-short", 1200, 0.0),  # urgency 0.06: same tenth as relaxed-long
        live("busier", 2000, 0.0),  # urgency 0.1: the next tenth up
    ]
    for r in requests:
        policy.enqueue(r, 0.0)
    order = [policy.pop_next(0.0, 0) for _ in requests]
    assert [r.req.request_id for r in order if r is not None] == [
        "urgent", "busier", "relaxed-short", "relaxed-long", "late"]


def test_registered_raw_and_with_overload_control() -> None:
    spec = SLOPolicySpec()
    assert make_policy(spec, name="slidingserve").name == "slidingserve"
    assert make_policy(spec, name="slidingserve-ac").waiting() == 0
