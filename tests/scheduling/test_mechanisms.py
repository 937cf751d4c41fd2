"""Each GMAX mechanism can be switched off by spec, and switching it off changes what
GMAX decides in a situation where the mechanism matters."""

from __future__ import annotations

from typing import Any

import numpy as np

from jitserve.bench.variants import ABLATIONS, VARIANTS, make_setup
from jitserve.policy import MechanismSettings, SLOPolicySpec, dump_policy_yaml, load_policy
from jitserve.requests import LiveRequest
from jitserve.scheduling.base import EngineView
from jitserve.scheduling.estimators import FrozenBounds, QuantileEstimator
from jitserve.scheduling.gmax import GMAX
from jitserve.slo import DeadlineSLO, LatencySLO
from tests.support.requests import choose_group, live


def spec(**mechanisms: bool) -> SLOPolicySpec:
    doc: dict[str, Any] = {
        "scheduler": {"cutoff": {"mode": "fixed", "value": 1.0}, "mechanisms": mechanisms}
    }
    return load_policy(doc)


def view(running: list[LiveRequest], batch: int, now: float = 0.0) -> EngineView:
    return EngineView(now, batch, running, 0.03, 1e-4, 1e-4)


def test_mechanisms_are_on_by_default_and_camel_case_on_the_wire() -> None:
    assert all(SLOPolicySpec().scheduler.mechanisms.model_dump().values())
    off = load_policy({"scheduler": {"mechanisms": {"lengthWindow": False}}})
    assert off.scheduler.mechanisms.length_window is False
    assert "lengthWindow: false" in dump_policy_yaml(off)
    for name, field in MechanismSettings.model_fields.items():
        assert field.description, name


def test_every_mechanism_has_an_ablation_variant() -> None:
    assert set(ABLATIONS.values()) == set(MechanismSettings.model_fields)
    for key, field in ABLATIONS.items():
        setup = make_setup(f"gmax-no-{key}", SLOPolicySpec())
        if field == "refinement":
            assert isinstance(setup.estimator, FrozenBounds)
        else:
            gmax = setup.policy
            assert isinstance(gmax, GMAX)
            assert getattr(gmax.spec.scheduler.mechanisms, field) is False


def test_cutoff_off_lets_every_top_candidate_into_the_window() -> None:
    rs = [live(f"r{i}", prompt=p) for i, p in enumerate([100, 110, 3000, 3100])]
    priority = np.array([1.0, 0.7, 0.8, 0.8])
    with_cutoff, _ = choose_group(rs, priority, 2, 1.0, 4)
    without, threshold = choose_group(rs, priority, 2, None, 4)
    assert list(with_cutoff) == [True, False, True, False]  # r1 is below the B-th best
    assert list(without) == [True, True, False, False]  # the homogeneous pair wins
    assert threshold == -np.inf


def test_length_window_off_takes_the_best_by_priority() -> None:
    rs = [live(f"r{i}", prompt=p) for i, p in enumerate([100, 110, 3000, 3100])]
    priority = np.array([1.0, 0.9, 1.0, 0.95])
    window, _ = choose_group(rs, priority, 2, 0.5, 4)
    best, _ = choose_group(rs, priority, 2, 0.5, 4, length_window=False)
    assert list(window) == [False, False, True, True]
    assert list(best) == [True, False, True, False]


def test_preemption_off_never_preempts() -> None:
    for on in (True, False):
        gmax = GMAX(spec(preemption=on))
        gmax.enqueue(live("challenger", prompt=10, output=20, slo=DeadlineSLO(5)), 0.0)
        victim = live("victim", prompt=10, output=1000, slo=DeadlineSLO(10), running=True)
        assert bool(gmax.frame(view([victim], batch=1)).preempt) is on


def test_fairness_off_ignores_f() -> None:
    def priority(fairness: bool) -> float:
        doc = {"fairness": {"weight": 1.0}, "scheduler": {"mechanisms": {"fairness": fairness}}}
        gmax = GMAX(load_policy(doc))
        gmax.on_finish(live("done", tenant="hog"), 5000.0, 0.0)
        r = live("r", tenant="hog")
        gmax.enqueue(r, 0.0)
        gmax.frame(view([], batch=4))
        return gmax.priority_of(r)

    plain = GMAX(SLOPolicySpec())
    r = live("r", tenant="hog")
    plain.enqueue(r, 0.0)
    plain.frame(view([], batch=4))
    assert priority(False) == plain.priority_of(r)
    assert priority(True) != plain.priority_of(r)


def test_aging_off_keeps_priority_flat_while_waiting() -> None:
    def priorities(aging: bool) -> list[float]:
        gmax = GMAX(spec(aging=aging))
        r = live("r", slo=DeadlineSLO(1000))
        gmax.enqueue(r, 0.0)
        out = []
        for frame in range(3):
            # a full batch (B = 1) keeps r waiting
            gmax.frame(view([live("busy", running=True)], batch=1, now=frame * 0.1))
            out.append(gmax.priority_of(r))
        return out

    aged = priorities(True)
    flat = priorities(False)
    assert aged[0] < aged[1] < aged[2]
    assert flat[0] == flat[1] == flat[2]


def test_sequencing_off_starts_the_group_by_priority() -> None:
    def first(sequencing: bool) -> str:
        gmax = GMAX(spec(latest_start_sequencing=sequencing))
        # the latency request must start first to be on time, but earns less per token
        urgent = live("urgent", prompt=1000, output=20, slo=LatencySLO(1.0, 0.1))
        rich = live("rich", prompt=100, output=50, slo=DeadlineSLO(60))
        for r in (rich, urgent):
            gmax.enqueue(r, 0.0)
        gmax.frame(view([], batch=8))
        head = gmax.pop_next(0.0, 0)
        assert head is not None
        return head.req.request_id

    assert first(True) == "urgent"
    assert first(False) == "rich"


def test_refinement_off_keeps_the_arrival_bound_until_outgrown() -> None:
    inner = QuantileEstimator(0.9, prior=())
    for n in range(1, 1001):
        inner.observe_length(n)
    frozen = FrozenBounds(inner)
    req = live("r").req
    at_arrival = frozen.bound(req, 0)
    assert frozen.bound(req, 500) == at_arrival  # refined, the quantile model says more
    assert inner.bound(req, 500) > at_arrival
    assert frozen.bound(req, at_arrival) > at_arrival  # outgrown: ask again
    assert "gmax-no-refinement" in VARIANTS
