"""Power-of-K on crafted reports: the replica-specific GMAX priority, the admit bar, the
refusals, the caller's subset and the sample of K."""

from __future__ import annotations

from dataclasses import replace

import pytest

from jitserve.placement.base import Ask, Pick, Refusal, ReplicaReport
from jitserve.placement.plugins import SampleK
from jitserve.placement.power_of_k import PowerOfK, ReplicaPriorities
from jitserve.placement.simple import SentSinceReport
from jitserve.slo import DeadlineSLO, LatencySLO

NOW = 100.0


def report(name: str, **fields: object) -> ReplicaReport:
    base: dict[str, object] = {
        "replica": name, "ready": True, "at_s": NOW, "max_running": 8, "running": 2,
        "waiting": 0, "decode_s": 0.02, "prefill_s": 1e-4, "token_s": 1e-4,
        "outstanding_tokens": 400, "tokens_per_s": 100.0,
    }  # fmt: skip
    base.update(fields)
    return ReplicaReport(**base)  # type: ignore[arg-type]


def tight(request_id: str = "r1", **fields: object) -> Ask:
    ask = Ask(request_id, "t", LatencySLO(ttft_s=0.5, tbt_s=0.05), 200, 120, 60, NOW)
    return replace(ask, **fields)  # type: ignore[arg-type]


def picked(choice: Pick | Refusal) -> str:
    assert isinstance(choice, Pick), choice
    return choice.replica


def test_priority_is_replica_specific_speed_and_queue() -> None:
    prio = ReplicaPriorities()
    sent = SentSinceReport()
    fast = prio.of(tight(), report("fast"), NOW, sent)
    slower = prio.of(tight(), report("slower", decode_s=0.04), NOW, sent)
    # a step slower than the TBT: fewer of its tokens are on time there
    slow = prio.of(tight(), report("slow", decode_s=0.08), NOW, sent)
    # a prompt backlog that puts the first token past its TTFT: worth nothing there
    backlogged = prio.of(
        tight(), report("busy", prefill_tokens=20_000, prefill_s=1e-4, running=8, waiting=0),
        NOW, sent,
    )  # fmt: skip
    assert fast[0] > slow[0] > 0
    # across replicas the cost is counted in each one's own step time
    assert fast[3] > slower[3] > slow[3] > 0
    assert backlogged[0] == 0.0 and not backlogged[2]


def test_goes_where_its_priority_clears_the_admit_priority() -> None:
    """The faster replica's slots are full and its bar is above this request's priority
    there; the slower one would start it now: placement by admission alone picks it."""
    placer = PowerOfK(seed=1, weights={"least-time": 0.0})
    full = report("fast", running=8, admit_priority=1e12, outstanding_tokens=100)
    room = report("slow", decode_s=0.03, running=3, outstanding_tokens=900)
    for i in range(5):
        assert picked(placer.place(tight(f"r{i}"), [full, room], NOW)) == "slow"
    # below the bar there, it would be admitted
    prio = ReplicaPriorities()
    p_fast, bar, admitted, _ = prio.of(tight(), full, NOW, SentSinceReport())
    assert not admitted and 0 < p_fast < bar
    assert prio.of(tight("r2"), replace(full, admit_priority=p_fast / 2), NOW,
                   SentSinceReport())[2]


def test_default_power_of_k_sends_a_tight_request_to_the_faster_emptier_replica() -> None:
    placer = PowerOfK(seed=3)
    fast = report("fast", running=1, outstanding_tokens=200)
    slow = report("slow", decode_s=0.045, running=5, outstanding_tokens=3000)
    choice = placer.place(tight(), [slow, fast], NOW)
    assert isinstance(choice, Pick)
    assert choice.replica == "fast" and choice.fallbacks == ("slow",)


def test_what_was_sent_since_the_report_raises_the_bar() -> None:
    placer = PowerOfK(seed=0)
    one_slot = report("a", max_running=4, running=3, outstanding_tokens=100)
    assert placer.priorities.admit_bar(one_slot, 0) == 0.0
    ask = tight("first")
    assert picked(placer.place(ask, [one_slot], NOW)) == "a"
    placer.placed(ask, "a")
    sent_priority = placer.priorities.sent_priorities["a"][0]
    assert sent_priority > 0
    assert placer.priorities.admit_bar(one_slot, placer.requests["a"]) == sent_priority
    placer.reported(one_slot)  # a fresh report shows it: the placer's own count goes
    assert placer.priorities.admit_bar(one_slot, 0) == 0.0 and "a" not in placer.requests


def test_refusals_503_none_ready_429_all_shedding() -> None:
    placer = PowerOfK()
    none = placer.place(tight(), [], NOW)
    assert isinstance(none, Refusal) and none.status == 503
    down = report("b", ready=False)
    refused = placer.place(tight(), [down], NOW)
    assert isinstance(refused, Refusal) and refused.status == 503
    # how old a report may be is the caller's rule (the gateway's Fleet), not the placer's
    late = report("a", at_s=NOW - 5.0)
    assert picked(placer.place(tight(), [late, down], NOW)) == "a"
    shedding = [report("a", shedding=True, waiting=400, running=8, outstanding_tokens=90_000),
                report("b", shedding=True, waiting=50, running=8, outstanding_tokens=9_000)]
    shed = placer.place(tight(), shedding, NOW)
    assert isinstance(shed, Refusal) and shed.status == 429
    assert shed.retry_after_s >= 1 and shed.retry_after_s == int(shed.retry_after_s)
    # one replica that does not shed takes it
    ok = placer.place(tight(), [*shedding, report("c")], NOW)
    assert picked(ok) == "c"


def test_the_callers_subset_limits_the_candidates() -> None:
    placer = PowerOfK()
    best, other = report("best", running=0, outstanding_tokens=0), report("other", running=6)
    ask = Ask("d", "t", DeadlineSLO(20.0), 100, 50, 20, NOW, allowed=frozenset({"other"}))
    assert picked(placer.place(ask, [best, other], NOW)) == "other"
    gone = placer.place(replace(ask, allowed=frozenset({"elsewhere"})), [best, other], NOW)
    assert isinstance(gone, Refusal) and gone.status == 503


def test_sample_of_k_places_among_k_replicas() -> None:
    reports = [report(f"r{i}") for i in range(6)]
    sample = SampleK(2, seed=7)
    seen = {r.replica for _ in range(50)
            for r in sample.filter(tight(), reports, NOW, SentSinceReport())}
    assert len(seen) > 2  # a fresh sample per request
    assert len(sample.filter(tight(), reports, NOW, SentSinceReport())) == 2
    placer = PowerOfK(seed=0, k=1)
    picks = set()
    for i in range(30):
        choice = placer.place(tight(f"r{i}"), reports, NOW)
        assert isinstance(choice, Pick)
        # one replica scored; every other eligible one is a fallback
        assert sorted([choice.replica, *choice.fallbacks]) == [r.replica for r in reports]
        picks.add(choice.replica)
    assert len(picks) > 1
    with pytest.raises(ValueError, match="k must be >= 1"):
        SampleK(0)


def test_unknown_weights_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown power-of-k scorer"):
        PowerOfK(weights={"nope": 1.0})


def test_a_request_placed_again_is_scored_on_the_reports_as_they_are_now() -> None:
    """A gateway re-places a request whose replica failed before its first token."""
    placer = PowerOfK(seed=0, weights={"least-time": 0.0})
    a, b = report("a", running=1), report("b", running=8, admit_priority=1e12)
    assert picked(placer.place(tight("same"), [a, b], NOW)) == "a"
    a_full = replace(a, running=8, admit_priority=1e12)
    b_free = replace(b, running=1, admit_priority=0.0)
    assert picked(placer.place(tight("same"), [a_full, b_free], NOW)) == "b"
