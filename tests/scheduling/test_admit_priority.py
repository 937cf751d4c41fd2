"""GMAX's admit bar (a replica report's ``admit_priority``): 0 while the live requests fit
the batch; p x the B-th best live priority once the slots bind, the same bar
:meth:`GroupFilter.admits` applies to an arrival; policies without a bar say 0."""

from __future__ import annotations

from jitserve.policy import load_policy
from jitserve.scheduling.base import EngineView
from jitserve.scheduling.gmax import GMAX
from jitserve.scheduling.registry import make_policy
from jitserve.slo import DeadlineSLO
from tests.support.requests import live


def test_admit_priority_is_the_groups_bar() -> None:
    gmax = GMAX(load_policy({"scheduler": {"cutoff": {"mode": "fixed", "value": 0.5}}}))
    running = [live(f"run{i}", output=50, slo=DeadlineSLO(30), running=True) for i in range(2)]
    gmax.frame(EngineView(0.0, 2, running, 0.03, 1e-4, 1e-4))
    assert gmax.admit_priority() == 0.0  # two live, two slots: no bar
    for i in range(3):
        gmax.enqueue(live(f"wait{i}", output=50 + 100 * i, slo=DeadlineSLO(30)), 0.0)
    gmax.frame(EngineView(0.1, 2, running, 0.03, 1e-4, 1e-4))
    live_priorities = sorted((gmax.priority_of(r) for r in [*running, *gmax.queue.rows]),
                             reverse=True)
    bar = gmax.admit_priority()
    assert bar > 0 and bar == 0.5 * live_priorities[1]
    assert gmax.group.admits(bar) and not gmax.group.admits(bar * 0.99)


def test_a_policy_without_a_bar_says_zero() -> None:
    fcfs = make_policy(load_policy({"scheduler": {"policy": "fcfs"}}))
    fcfs.enqueue(live("a"), 0.0)
    assert fcfs.admit_priority() == 0.0
