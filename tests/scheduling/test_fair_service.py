"""GMAX's fairness claims steer by service given, and the pacer keeps what the fair order
started on pace (issue 27).

- A tenant's service is credited in its books when its request starts (what the request
  would earn by meeting its SLO, the units of its demand), once: a preempted request
  that starts again is not credited twice, and a finish adds nothing (a program's goodput
  lands tens of seconds after its calls took the engine).
- The pacer protects a low quantile of the running requests' per-token needs at f = 0
  and the tightest need at f = 1.
"""

from __future__ import annotations

import numpy as np
import pytest

from jitserve.policy import load_policy
from jitserve.scheduling.gmax import GMAX
from jitserve.scheduling.gmax.pacing import TAU_QUANTILE
from jitserve.slo import DeadlineSLO, LatencySLO
from tests.support.requests import live


def test_service_is_credited_when_a_request_starts_and_only_once() -> None:
    gmax = GMAX(load_policy({"fairness": {"weight": 1.0}}))
    deadline = live("d", tenant="a", prompt=300, output=50, slo=DeadlineSLO(60.0))
    stream = live("s", tenant="b", prompt=300, output=50, slo=LatencySLO(2.0, 0.1))
    for r in (deadline, stream):
        gmax.enqueue(r, 0.0)
    books = gmax.fair.books
    assert dict(books.asked) == {"a": 350.0, "b": 50.0}  # a latency prompt earns nothing
    assert sum(books.served.values()) == 0.0

    first = gmax.pop_next(0.0, 0)
    assert first is not None
    first.started_s = 0.0  # the lifecycle marks the start
    assert dict(books.served) == {first.req.tenant: books.asked[first.req.tenant]}
    second = gmax.pop_next(0.0, 1)
    assert second is not None and second is not first
    second.started_s = 0.0
    credited = dict(books.served)
    assert credited == dict(books.asked)

    # preempted and waiting again: neither demand nor service is counted twice
    gmax.enqueue(first, 1.0)
    assert dict(books.asked) == {"a": 350.0, "b": 50.0}
    again = gmax.pop_next(1.0, 0)
    assert again is first
    assert dict(books.served) == credited
    # finishing adds nothing to the books the claims read
    gmax.on_finish(first, 350.0, 2.0)
    assert dict(books.served) == credited


@pytest.mark.parametrize("f, quantile", [(0.0, TAU_QUANTILE), (0.5, TAU_QUANTILE / 2),
                                         (1.0, 0.0)])
def test_the_pacer_protects_the_tightest_need_as_f_grows(f: float, quantile: float) -> None:
    gmax = GMAX(load_policy({"fairness": {"weight": f}}))
    pacer = gmax.pacer
    assert pacer is not None
    needs = np.array([0.02, 0.05, 0.08, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 2.0, 4.0])
    pacer.on_frame(0.0, needs, 0.01)
    assert pacer.tau_s == pytest.approx(float(np.quantile(needs, quantile)))
    if f == 1.0:
        assert pacer.tau_s == needs.min()


def test_with_fairness_switched_off_the_pacer_protects_as_at_f_0() -> None:
    spec = load_policy({"fairness": {"weight": 1.0},
                        "scheduler": {"mechanisms": {"fairness": False}}})
    pacer = GMAX(spec).pacer
    assert pacer is not None
    needs = np.linspace(0.02, 2.0, 21)
    pacer.on_frame(0.0, needs, 0.01)
    assert pacer.tau_s == pytest.approx(float(np.quantile(needs, TAU_QUANTILE)))
