from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jitserve.policy import SLOPolicySpec, load_policy
from jitserve.requests import LiveRequest
from jitserve.scheduling.base import EngineView, Policy
from jitserve.scheduling.baselines import EDF, FCFS, LSF, PLAS, SJF
from jitserve.scheduling.estimators import ExactEstimator, MeanEstimator, QuantileEstimator
from jitserve.scheduling.gmax import GMAX
from jitserve.scheduling.registry import make_policy
from jitserve.scheduling.slack import latency_tokens_reachable
from jitserve.slo import DeadlineSLO, LatencySLO
from tests.support.requests import choose_group, live


def drain(policy: Policy, rs: list[LiveRequest], now: float = 0.0) -> list[str]:
    for r in rs:
        policy.enqueue(r, now)
    order = []
    while (r := policy.pop_next(now, 0)) is not None:
        order.append(r.req.request_id)
    return order


def test_fcfs_serves_in_arrival_order() -> None:
    rs = [live("late", arrival=2.0), live("early", arrival=0.5), live("mid", arrival=1.0)]
    assert drain(FCFS(), rs, 3.0) == ["early", "mid", "late"]


def test_edf_serves_earliest_deadline_and_latency_by_next_token_due() -> None:
    rs = [
        live("d30", slo=DeadlineSLO(30.0)),
        live("d10", slo=DeadlineSLO(10.0)),
        live("lat", slo=LatencySLO(2.0, 0.1)),  # next token due at 2 s
    ]
    assert drain(EDF(), rs) == ["lat", "d10", "d30"]


def test_lsf_accounts_for_remaining_work() -> None:
    # same deadline; the longer request has less slack
    rs = [
        live("short", bound=10, slo=DeadlineSLO(30)),
        live("long", bound=900, slo=DeadlineSLO(30)),
    ]
    assert drain(LSF(), rs) == ["long", "short"]


def test_sjf_serves_shortest_predicted_remaining_first() -> None:
    rs = [live("a", bound=500), live("b", bound=20), live("c", bound=100, generated=90)]
    assert drain(SJF(), rs) == ["c", "b", "a"]


def test_plas_counts_program_service_in_quanta() -> None:
    from jitserve.requests import LiveProgram, LLMCall, Program, Stage
    from jitserve.slo import CompoundSLO

    program = Program("p", "t", 0.0, CompoundSLO(60), (Stage((LLMCall(10, 10),)),))
    served = LiveProgram(program, attained_tokens=900)
    a = live("heavy-program", arrival=0.0)
    a.program = served
    b = live("fresh", arrival=5.0)
    c = live("light", arrival=1.0, generated=399)
    assert drain(PLAS(), [a, b, c], 6.0) == ["light", "fresh", "heavy-program"]


def test_preemptive_baseline_swaps_worse_running_request() -> None:
    policy = EDF()
    running = [live("late-deadline", slo=DeadlineSLO(100), running=True)]
    policy.enqueue(live("urgent", slo=DeadlineSLO(5)), 0.0)
    plan = policy.frame(EngineView(0.0, 1, running, 0.03, 1e-4, 1e-4))
    assert [r.req.request_id for r in plan.preempt] == ["late-deadline"]
    assert FCFS().frame(EngineView(0.0, 1, running, 0.03, 1e-4, 1e-4)).preempt == []


@settings(max_examples=200, deadline=None)
@given(
    first=st.integers(0, 50),
    count=st.integers(1, 200),
    start=st.floats(0, 20),
    v=st.floats(0.005, 0.3),
    due0=st.floats(0, 20),
    tbt=st.floats(0.01, 0.3),
)
def test_reachable_latency_tokens_match_brute_force(first, count, start, v, due0, tbt):  # type: ignore[no-untyped-def]
    i = np.arange(first, first + count)
    brute = int(np.count_nonzero(start + (i - first + 1) * v <= due0 + i * tbt + 1e-9))
    fast = latency_tokens_reachable(
        np.array([first], float),
        np.array([count], float),
        np.array([start]),
        v,
        np.array([due0]),
        np.array([tbt]),
    )
    assert abs(int(fast[0]) - brute) <= 1  # floating-point boundary at most one token


def view(running: list[LiveRequest], batch: int, now: float = 0.0) -> EngineView:
    return EngineView(
        now, batch, running, decode_step_s=0.03, prefill_s_per_token=1e-4, token_s=1e-4
    )


def fixed(p: float = 1.0, **extra: object) -> SLOPolicySpec:
    return load_policy({"scheduler": {"cutoff": {"mode": "fixed", "value": p}, **extra}})


def test_gmax_prefers_more_goodput_per_unit_of_work() -> None:
    gmax = GMAX(fixed())
    cheap = live("cheap", prompt=100, output=50)
    late = live("projected-late", prompt=4000, output=900, slo=DeadlineSLO(5))  # needs ~27 s
    latency = live("latency", prompt=100, output=50, slo=LatencySLO(2.0, 0.1))
    for r in (late, latency, cheap):
        gmax.enqueue(r, 0.0)
    gmax.frame(view([], batch=1))
    # deadline tokens count input and output; latency tokens only output: same cost, less goodput
    assert gmax.priority_of(cheap) > gmax.priority_of(latency)
    # a request projected to miss its deadline is discounted by its chance of finishing
    assert gmax.priority_of(cheap) > gmax.priority_of(late)
    assert gmax.pop_next(0.0, 0) is cheap


def test_gmax_group_is_sequenced_by_latest_start() -> None:
    gmax = GMAX(fixed())
    relaxed = live("relaxed", slo=DeadlineSLO(60))
    urgent = live("urgent", slo=LatencySLO(1.0, 0.1))
    for r in (relaxed, urgent):
        gmax.enqueue(r, 0.0)
    gmax.frame(view([], batch=8))
    assert [gmax.pop_next(0.0, 0).req.request_id for _ in range(2)] == ["urgent", "relaxed"]  # type: ignore[union-attr]


def test_gmax_overload_control_drops_what_cannot_start_in_time() -> None:
    gmax = make_policy(fixed(), name="gmax")
    # each prompt takes 1 s to prefill (10k tokens at 1e-4 s); deadlines allow only one
    a = live("a", prompt=10000, output=1, slo=DeadlineSLO(1.5))
    b = live("b", prompt=10000, output=1, slo=DeadlineSLO(1.6))
    for r in (a, b):
        gmax.enqueue(r, 0.0)
    gmax.frame(view([], batch=8))
    first = gmax.pop_next(0.0, 0)
    assert first is not None and first.req.request_id == "a"
    # b left the group: it is ordered after any group member that arrives now
    newcomer = live("new", prompt=10, output=1, slo=DeadlineSLO(30))
    gmax.enqueue(newcomer, 0.0)
    assert gmax.pop_next(0.0, 0) is newcomer


def test_gmax_cutoff_and_window_pick_homogeneous_group() -> None:
    # four candidates pass p=0.5; the window of two with the highest priority sum wins
    rs = [live(f"r{i}", prompt=p, output=100) for i, p in enumerate([100, 110, 3000, 3100])]
    priority = np.array([1.0, 0.9, 1.0, 0.95])
    chosen, threshold = choose_group(rs, priority, 2, 0.5, 4)
    assert [r.req.request_id for r, c in zip(rs, chosen, strict=True) if c] == ["r2", "r3"]
    assert threshold == 0.5 * 1.0  # p x the B-th best
    chosen, _ = choose_group(rs, priority, 2, 1.0, 4)
    assert chosen.sum() == 2 and chosen[0] and chosen[2]


def test_gmax_preempts_only_lost_requests_and_only_when_it_pays() -> None:
    def plan_for(victim: LiveRequest, **preemption: object) -> list[LiveRequest]:
        gmax = GMAX(fixed(preemption=preemption) if preemption else fixed())
        gmax.enqueue(live("challenger", prompt=10, output=20, slo=DeadlineSLO(5)), 0.0)
        return gmax.frame(view([victim], batch=1)).preempt

    # 1000 tokens at 30 ms cannot finish within 10 s: it can earn nothing more
    lost = live("lost", prompt=3000, output=1000, slo=DeadlineSLO(10), running=True)
    assert plan_for(lost) == [lost]
    # one that can still finish keeps its slot, however much better the challenger is
    fine = live("fine", prompt=10, output=1000, slo=DeadlineSLO(10000), running=True)
    assert plan_for(fine) == []
    # recomputing a huge context costs more than a frame of the challenger earns
    big = live("big", prompt=100000, output=1000, slo=DeadlineSLO(10), running=True)
    assert plan_for(big) == []
    assert plan_for(lost, costFactor=100.0) == []
    assert plan_for(lost, enabled=False) == []


def test_gmax_retires_overdue_and_unreachable_requests() -> None:
    gmax = make_policy(fixed(), name="gmax")
    # waited past maxWaitingSeconds (5 s) and left out of the group (B = 1): retired
    stale = live("stale", arrival=0.0, prompt=10, output=1000, slo=DeadlineSLO(100))
    doomed = live("doomed", arrival=9.0, prompt=50000, slo=DeadlineSLO(2))
    best = live("best", arrival=9.0, prompt=2000, output=10, slo=DeadlineSLO(100))
    for r in (stale, doomed, best):
        gmax.enqueue(r, 9.0)
    plan = gmax.frame(view([], batch=1, now=10.0))
    reasons = {r.request.req.request_id: r.reason.value for r in plan.retire}
    assert reasons == {"stale": "max_waiting", "doomed": "unreachable"}
    assert gmax.pop_next(10.0, 0) is best


def test_gmax_keeps_a_long_waiting_request_it_still_plans_to_serve() -> None:
    gmax = make_policy(fixed(), name="gmax")
    patient = live("patient", arrival=0.0, slo=DeadlineSLO(100))
    gmax.enqueue(patient, 9.0)
    assert gmax.frame(view([], batch=8, now=10.0)).retire == []
    assert gmax.pop_next(10.0, 0) is patient


def test_gmax_demotes_instead_of_dropping_when_configured() -> None:
    demote = make_policy(load_policy({"admission": {"overloadAction": "demote"}}), name="gmax")
    doomed = live("doomed", arrival=9.0, prompt=50000, slo=DeadlineSLO(2))
    demote.enqueue(doomed, 9.0)
    assert demote.frame(view([], batch=8, now=10.0)).retire == []
    assert demote.pop_next(10.0, 0) is doomed  # still served, as best effort


def test_fairness_weight_lifts_the_tenant_below_its_share() -> None:
    def run(weight: float) -> tuple[float, float, str]:
        gmax = GMAX(load_policy({"fairness": {"weight": weight}}))
        served = live("hog-served", tenant="hog", prompt=4000, output=1000)
        gmax.enqueue(served, 0.0)
        assert gmax.pop_next(0.0, 0) is served  # hog was given service
        served.started_s = 0.0
        mine = live("hog-new", tenant="hog", prompt=100, output=50)
        theirs = live("meek-new", tenant="meek", prompt=100, output=50, slo=LatencySLO(2.0, 0.1))
        gmax.enqueue(mine, 0.2)
        gmax.enqueue(theirs, 0.2)
        gmax.frame(view([], batch=4, now=0.2))
        first = gmax.pop_next(0.2, 0)
        assert first is not None
        return gmax.priority_of(mine), gmax.priority_of(theirs), first.req.request_id

    hog, meek, _ = run(0.0)
    assert hog > meek  # pure goodput: the deadline request earns input + output tokens
    hog, meek, first = run(1.0)
    assert meek > hog  # pure fair share: the tenant below its share comes first
    assert first == "meek-new"


def test_auto_cutoff_explores_and_reports_p() -> None:
    gmax = GMAX(load_policy({"scheduler": {"cutoff": {"mode": "auto", "epochFrames": 1}}}))
    seen = set()
    for frame in range(12):
        gmax.on_finish(live(f"x{frame}"), 100.0 * (frame % 3), float(frame))
        gmax.frame(view([], batch=4, now=float(frame)))
        seen.add(gmax.describe()["cutoff"])
    assert len(seen) >= 3


def test_estimators_refine_and_never_undercut_generated() -> None:
    q = QuantileEstimator(0.9, prior=())
    for n in range(1, 1001):
        q.observe_length(n)
    r = live("r").req
    assert q.bound(r, 0) == 901
    assert q.bound(r, 950) >= 951
    assert q.bound(r, 0) / 500 > q.bound(r, 500) / 750  # relaxes toward the truth
    assert q.expected(r, 0) == 500.0  # mean of 1..1000 (rounded)
    assert q.expected(r, 800) == 900.0  # mean of 801..1000
    assert ExactEstimator().bound(live("o", output=42).req, 10) == 42
    mean = MeanEstimator(prior_tokens=100)
    mean.observe(r, 300)
    assert mean.bound(r, 0) == 200


def test_over_share_tenants_running_work_gives_way_to_an_under_share_request_out_of_pace(
) -> None:
    """With f > 0, a running request of a tenant below its share that needs tokens faster
    than decoding alone gives makes the over-share tenant's running requests give way:
    the largest context first, ceil(f x 2) per frame; none at f = 0 or when pacing can
    still meet the need, and never a request that may not be preempted."""
    def plan(weight: float, tbt_s: float, pinned: bool = False) -> list[str]:
        gmax = GMAX(load_policy({"fairness": {"weight": weight}}))
        gmax.fair.books.asked.update({"hog": 1000.0, "meek": 1000.0})
        gmax.fair.books.served.update({"hog": 1000.0, "meek": 10.0})
        hogs = [live(f"hog-{n}", tenant="hog", prompt=n, output=500, slo=DeadlineSLO(1000),
                     running=True) for n in (1000, 5000, 3000)]
        hogs[1].req = dataclasses.replace(hogs[1].req, preemptible=not pinned)
        meek = live("meek", tenant="meek", prompt=10, output=100, generated=5,
                    slo=LatencySLO(10.0, tbt_s), running=True)
        running = [*hogs, meek]
        # decoding alone: 10 ms per running request, 40 ms for these four
        engine = EngineView(0.0, 8, running, decode_step_s=0.04, prefill_s_per_token=1e-4,
                            token_s=0.01)
        return [r.req.request_id for r in gmax.frame(engine).preempt]

    assert plan(1.0, tbt_s=0.02) == ["hog-5000", "hog-3000"]
    assert plan(0.5, tbt_s=0.02) == ["hog-5000"]
    assert plan(1.0, tbt_s=0.02, pinned=True) == ["hog-3000", "hog-1000"]
    assert plan(0.0, tbt_s=0.02) == []
    assert plan(1.0, tbt_s=0.1) == []  # 100 ms a token: pacing's to keep, not preemption's


def test_over_share_tenants_start_nothing_while_the_batch_is_too_big_for_the_others(
) -> None:
    """With f > 0, while decoding the running batch alone (token_s a request) takes longer
    than a request of a tenant at or below its share needs per token, the tenants above
    their share start nothing new, the others still do. At f = 0, or once the batch is
    small enough, every tenant starts as before."""
    def startable(weight: float, tbt_s: float, running_hogs: int = 3,
                  reload_to: float | None = None) -> list[str]:
        gmax = GMAX(load_policy({"fairness": {"weight": weight},
                                 "scheduler": {"mechanisms": {"preemption": False}}}))
        gmax.fair.books.asked.update({"hog": 1000.0, "meek": 1000.0})
        gmax.fair.books.served.update({"hog": 1000.0, "meek": 10.0})
        running = [live(f"hog-{n}", tenant="hog", prompt=100, output=500, running=True,
                        slo=DeadlineSLO(1000)) for n in range(running_hogs)]
        running.append(live("meek-running", tenant="meek", prompt=10, output=100,
                            generated=5, slo=LatencySLO(10.0, tbt_s), running=True))
        for tenant in ("hog", "meek"):
            gmax.enqueue(live(f"{tenant}-new", tenant=tenant, prompt=50, output=400,
                              slo=DeadlineSLO(1000)), 0.0)
        # decoding alone: 10 ms per running request
        gmax.frame(EngineView(0.0, 8, running, decode_step_s=0.01 * len(running),
                              prefill_s_per_token=1e-4, token_s=0.01))
        shown = gmax.describe().get("fair_yield_batch")
        assert shown == (None if weight == 0 else pytest.approx(tbt_s / 0.01))
        if reload_to is not None:  # a hot reload between frames
            gmax.configure(load_policy({"fairness": {"weight": reload_to}}))
        started = []
        while (r := gmax.pop_next(0.0, len(running))) is not None:
            started.append(r.req.request_id)
            running.append(r)
        return sorted(started)

    both = ["hog-new", "meek-new"]
    assert startable(0.0, tbt_s=0.02) == both
    assert startable(1.0, tbt_s=0.1) == both  # 5 and 6 x 10 ms meet 100 ms a token
    assert startable(1.0, tbt_s=0.02) == ["meek-new"]  # 40 ms does not meet 20 ms
    assert startable(0.5, tbt_s=0.02) == ["meek-new"]
    # 30 ms a token: up to three running (one, then meek's: the hog's is the third)
    assert startable(1.0, tbt_s=0.03, running_hogs=0) == both
    assert startable(1.0, tbt_s=0.03, running_hogs=1) == ["meek-new"]
    assert startable(1.0, tbt_s=0.02, reload_to=0.0) == both


def test_an_under_share_tenants_waiting_request_is_kept_past_the_max_wait() -> None:
    """With f > 0 the fair order plans to serve the tenants below their share: their
    waiting requests that can still earn are not given up for waiting past
    maxWaitingSeconds (at f = 0 one left out of the group is). "meek" is below its share:
    "hog" was served, it was not."""
    def retired(weight: float) -> list[str]:
        gmax = make_policy(load_policy({"fairness": {"weight": weight},
                                        "scheduler": {"cutoff": {"mode": "fixed", "value": 1.0}}}),
                           name="gmax")
        assert isinstance(gmax, GMAX)
        gmax.fair.books.asked["hog"] = gmax.fair.books.served["hog"] = 1000.0
        stale = live("stale", tenant="meek", arrival=0.0, prompt=10, output=1000,
                     slo=DeadlineSLO(100))
        best = live("best", tenant="meek", arrival=9.0, prompt=2000, output=10,
                    slo=DeadlineSLO(100))
        hog = live("hog", tenant="hog", arrival=9.0, prompt=2000, output=10,
                   slo=DeadlineSLO(100))
        for r in (stale, best, hog):
            gmax.enqueue(r, 9.0)
        plan = gmax.frame(view([], batch=1, now=10.0))
        return [r.request.req.request_id for r in plan.retire]

    assert retired(0.0) == ["stale"]
    assert retired(1.0) == []
