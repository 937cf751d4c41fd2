"""Overload control is one layer, the same for GMAX and every ``-ac`` baseline."""

from __future__ import annotations

import pytest

from jitserve.policy import SLOPolicySpec, load_policy
from jitserve.requests import LiveRequest
from jitserve.scheduling.base import EngineView, Policy
from jitserve.scheduling.baselines import EDF
from jitserve.scheduling.gmax import GMAX
from jitserve.scheduling.overload import OverloadControl
from jitserve.scheduling.registry import BASELINES, make_policy, scheduler_names
from jitserve.scheduling.staged import StagedPolicy
from jitserve.slo import DeadlineSLO
from tests.support.policies import Spy
from tests.support.requests import live


def view(running: list[LiveRequest], now: float, batch: int = 8) -> EngineView:
    return EngineView(now, batch, running, 0.03, 1e-4, 1e-4)


def test_every_baseline_has_an_ac_form_built_on_the_same_layer() -> None:
    spec = SLOPolicySpec()
    for name in BASELINES:
        raw = make_policy(spec, name=name)
        ac = make_policy(spec, name=f"{name}-ac")
        assert isinstance(raw, StagedPolicy) and raw.overload is None
        assert isinstance(ac, StagedPolicy) and ac.overload is not None
        assert type(ac) is type(raw)
        assert ac.name == f"{name}-ac" and f"{name}-ac" in scheduler_names()
    gmax = make_policy(spec, name="gmax")
    assert isinstance(gmax, GMAX) and gmax.overload is not None and gmax.name == "gmax"


def test_unreachable_work_is_retired_before_the_policy_plans() -> None:
    spy = layer = Spy(SLOPolicySpec(), OverloadControl())
    # 50k prompt tokens at 1e-4 s each: 5 s of prefill against a 2 s deadline
    doomed = live("doomed", arrival=9.0, prompt=50000, slo=DeadlineSLO(2))
    running_doomed = live("running-doomed", arrival=0.0, slo=DeadlineSLO(5), running=True)
    fine = live("fine", arrival=9.0, slo=DeadlineSLO(100))
    for r in (doomed, fine):
        layer.enqueue(r, 9.0)
    plan = layer.frame(view([running_doomed], now=10.0))
    reasons = {x.request.req.request_id: x.reason.value for x in plan.retire}
    assert reasons == {"doomed": "unreachable", "running-doomed": "unreachable"}
    assert spy.seen == [{"fine"}]  # the policy never planned with lost work
    assert layer.pop_next(10.0, 0) is fine


def test_overdue_requests_are_retired_unless_planned_or_started() -> None:
    spec = load_policy({"admission": {"maxWaitingSeconds": 5}})
    layer = EDF(spec, OverloadControl())
    stale = live("stale", arrival=0.0, slo=DeadlineSLO(1000))
    started = live("started", arrival=0.0, slo=DeadlineSLO(1000))
    started.started_s = 1.0  # ran before and was preempted: not "never started"
    fresh = live("fresh", arrival=8.0, slo=DeadlineSLO(1000))
    for r in (stale, started, fresh):
        layer.enqueue(r, 8.0)
    # B = 1 and one request running: no free slot, so EDF plans to start nobody now
    busy = live("busy", arrival=0.0, slo=DeadlineSLO(1000), running=True)
    plan = layer.frame(view([busy], now=10.0, batch=1))
    assert [(x.request.req.request_id, x.reason.value) for x in plan.retire] == [
        ("stale", "max_waiting")
    ]
    # with room, the head of EDF's queue is planned and kept past the waiting limit
    layer2 = EDF(spec, OverloadControl())
    stale2 = live("stale", arrival=0.0, slo=DeadlineSLO(1000))
    layer2.enqueue(stale2, 8.0)
    assert layer2.frame(view([], now=10.0, batch=4)).retire == []


@pytest.mark.parametrize("retires", ["all", "late"])
def test_late_keeps_waiting_what_its_deadline_still_pays_for(retires: str) -> None:
    spec = load_policy({"admission": {"maxWaitingSeconds": 5, "maxWaitingRetires": retires}})
    layer = EDF(spec, OverloadControl())
    # both waited 10 s; 100 tokens at 0.03 s each: "loose" needs ~3 s of the 990 left,
    # "tight" ~3 s of 2.5 (reachable alone at unloaded speed, so rule 1 keeps it)
    loose = live("loose", arrival=0.0, slo=DeadlineSLO(1000))
    tight = live("tight", arrival=0.0, slo=DeadlineSLO(12.5))
    for r in (loose, tight):
        layer.enqueue(r, 0.0)
    busy = live("busy", arrival=0.0, slo=DeadlineSLO(1000), running=True)
    plan = layer.frame(EngineView(10.0, 1, [busy], 0.03, 1e-4, 1e-4))
    retired = sorted(x.request.req.request_id for x in plan.retire)
    assert retired == (["loose", "tight"] if retires == "all" else ["tight"])
    assert {x.reason.value for x in plan.retire} == {"max_waiting"}


def test_raw_baselines_never_retire() -> None:
    edf = make_policy(SLOPolicySpec(), name="edf")
    doomed = live("doomed", arrival=0.0, prompt=50000, slo=DeadlineSLO(2))
    edf.enqueue(doomed, 0.0)
    assert edf.frame(view([], now=100.0)).retire == []


@pytest.mark.parametrize("name", ["edf-ac", "gmax"])
def test_demote_keeps_the_request_as_best_effort(name: str) -> None:
    spec = load_policy({"admission": {"overloadAction": "demote"}})
    policy = make_policy(spec, name=name)
    doomed = live("doomed", arrival=9.0, prompt=50000, slo=DeadlineSLO(2))
    policy.enqueue(doomed, 9.0)
    assert policy.frame(view([], now=10.0)).retire == []
    urgent = live("urgent", arrival=10.0, slo=DeadlineSLO(20))
    policy.enqueue(urgent, 10.0)
    if name == "gmax":
        policy.frame(view([], now=10.0))
    assert policy.pop_next(10.0, 0) is urgent  # everything with an SLO first
    assert policy.pop_next(10.0, 0) is doomed  # then the demoted one, still served


def test_gmax_overload_control_follows_the_mechanism_switch_on_reload() -> None:
    on = SLOPolicySpec()
    off = load_policy({"scheduler": {"mechanisms": {"overloadControl": False}}})
    policy: Policy = make_policy(on, name="gmax")
    doomed = live("doomed", arrival=9.0, prompt=50000, slo=DeadlineSLO(2))
    policy.configure(off)
    policy.enqueue(doomed, 9.0)
    assert policy.frame(view([], now=10.0)).retire == []
    policy.configure(on)
    assert [x.request for x in policy.frame(view([], now=10.5)).retire] == [doomed]
    # the -ac baselines keep the layer whatever the GMAX switch says
    edf_ac = make_policy(off, name="edf-ac")
    doomed2 = live("doomed2", arrival=9.0, prompt=50000, slo=DeadlineSLO(2))
    edf_ac.enqueue(doomed2, 9.0)
    assert len(edf_ac.frame(view([], now=10.0)).retire) == 1
