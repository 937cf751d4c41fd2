"""The bench's tenant table: goodput shares beside max-min fair shares and Jain's index
(issue 27)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from jitserve.bench.tenants import tenant_fairness, tenants_markdown
from jitserve.policy import load_policy
from jitserve.requests import LLMCall, Program, Request, Stage
from jitserve.sim.workload import (
    WorkloadSpec,
    generate,
    held_to_contracts,
    offered_tokens_by_tenant,
    parse_claims,
)
from jitserve.slo import CompoundSLO, DeadlineSLO, LatencySLO


def entry(goodput: dict[str, float], demand: dict[str, float]) -> dict[str, object]:
    return {"scenario": "", "load": 1.5, "policy": "gmax",
            "goodput_tokens_by_tenant": goodput, "demand_tokens_by_tenant": demand}


def test_a_tenant_that_took_everything_is_unfair_by_max_min() -> None:
    figures = tenant_fairness(entry({"a": 300.0, "b": 0.0, "c": 0.0},
                                    {"a": 300.0, "b": 100.0, "c": 100.0}), lambda t: 1.0)
    assert figures is not None
    rows, jain = figures
    assert [r["max_min_share"] for r in rows] == pytest.approx([1 / 3, 1 / 3, 1 / 3])
    assert [r["goodput_share"] for r in rows] == pytest.approx([1.0, 0.0, 0.0])
    assert [r["demand_share"] for r in rows] == pytest.approx([0.6, 0.2, 0.2])
    assert jain == pytest.approx(1 / 3)


def test_weights_move_the_max_min_share_and_one_tenant_says_nothing() -> None:
    figures = tenant_fairness(entry({"a": 200.0, "b": 100.0}, {"a": 1000.0, "b": 1000.0}),
                              {"a": 2.0, "b": 1.0}.__getitem__)
    assert figures is not None
    assert [r["max_min_share"] for r in figures[0]] == pytest.approx([2 / 3, 1 / 3])
    assert figures[1] == pytest.approx(1.0)
    assert tenant_fairness(entry({"a": 10.0}, {"a": 10.0}), lambda t: 1.0) is None
    assert tenants_markdown([entry({"a": 10.0}, {"a": 10.0})], lambda t: 1.0) == ""
    table = tenants_markdown([entry({"a": 1.0, "b": 1.0}, {"a": 1.0, "b": 1.0})], lambda t: 1.0)
    assert "Jain's index" in table and "| - | 1.50 | gmax | a |" in table


def test_demand_counts_the_goodput_each_item_would_earn_meeting_its_slo() -> None:
    """A deadline request or program earns its prompt and output tokens, a latency
    request only its output tokens: demand in the units of the goodput it shares."""
    program = Program("p", "b", 0.0, CompoundSLO(30.0),
                      (Stage((LLMCall(10, 5), LLMCall(20, 5))),))
    items = [Request("r1", "a", DeadlineSLO(5.0), 100, 0.0, output_tokens=50),
             Request("r2", "a", DeadlineSLO(5.0), 10, 1.0, output_tokens=5), program,
             Request("r3", "c", LatencySLO(1.0, 0.1), 1000, 2.0, output_tokens=7)]
    assert offered_tokens_by_tenant(items) == {"a": 165, "b": 40, "c": 7}


def test_a_gaming_tenant_claims_tighter_and_the_contract_clamps_or_drops_it() -> None:
    spec = WorkloadSpec(trace="synthetic", arrival="poisson", rate_per_s=20, duration_s=5,
                        tenants=("a", "b"), claim_scale=parse_claims("a=0.25"))
    honest = list(generate(replace(spec, claim_scale=())))
    gaming = list(generate(spec))
    assert len(honest) == len(gaming) > 20
    for h, g in zip(honest, gaming, strict=True):
        if g.tenant == "b" or (isinstance(g.slo, DeadlineSLO) and g.slo.best_effort):
            assert g.slo == h.slo
        elif isinstance(g.slo, LatencySLO):
            assert isinstance(h.slo, LatencySLO)
            assert g.slo.ttft_s == pytest.approx(h.slo.ttft_s / 4)
        else:
            assert g.slo.deadline_s == pytest.approx(h.slo.deadline_s / 4)  # type: ignore[union-attr]
    bounds = {"ttftMs": 2000, "tbtMs": 100, "deadlineSeconds": 20}
    for action, kept in (("clamp", len(gaming)), ("refuse", None)):
        fairness = load_policy({"fairness": {"beyondContract": action, "tenants": [
            {"name": "a", "tightest": bounds}]}}).fairness
        counted: dict[str, int] = {}
        held = list(held_to_contracts(gaming, fairness, counted))
        beyond = counted["a"]
        assert beyond > 5 and set(counted) == {"a"}
        assert len(held) == (kept if kept is not None else len(gaming) - beyond)
        assert all(not fairness.tenants[0].tightest.beyond(i.slo)  # type: ignore[union-attr]
                   for i in held if i.tenant == "a")
    with pytest.raises(ValueError, match="--claims"):
        parse_claims("a=0")
