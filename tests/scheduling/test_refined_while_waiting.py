"""A bound refined while its request waits (a remote estimator answering after the
request was preempted) reaches the policy at the next frame: the policy reads a
waiting request's state when it is queued."""

from __future__ import annotations

from jitserve.requests import Request
from jitserve.scheduling.estimators import QuantileEstimator
from jitserve.scheduling.gmax import GMAX
from jitserve.serving.lifecycle import Lifecycle
from jitserve.serving.speed import SpeedMeter
from jitserve.slo import DeadlineSLO


class NullExecutor:
    def sync(self, now_s: float) -> None:
        pass

    def stop(self, r: object) -> None:
        pass


def test_the_policy_sees_a_bound_refined_while_the_request_waits() -> None:
    gmax = GMAX()
    lc = Lifecycle(gmax, QuantileEstimator(0.95), NullExecutor(), SpeedMeter(0.03, 1e-4, 1e-4))
    r = lc.arrive(Request("r", "t", DeadlineSLO(60.0), 100, 0.0, max_tokens=2000), 0.0)
    row = gmax.queue.row_of(r)
    assert row is not None
    before = float(gmax.queue.floats("remaining")[row])
    lc.refine(r, bound=1500, at=0)  # the analyzer's late answer
    lc.frame(0.1, 4)
    row = gmax.queue.row_of(r)
    assert row is not None
    assert before != 1500.0
    assert float(gmax.queue.floats("remaining")[row]) == 1500.0
    assert int(gmax.queue.ints("waited")[row]) == 1  # what GMAX kept stays
