"""The bench's tenant table: goodput shares beside max-min fair shares and Jain's index
(issue 27)."""

from __future__ import annotations

import pytest

from jitserve.bench.tenants import tenant_fairness, tenants_markdown
from jitserve.requests import LLMCall, Program, Request, Stage
from jitserve.sim.workload import offered_tokens_by_tenant
from jitserve.slo import CompoundSLO, DeadlineSLO


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


def test_demand_counts_every_token_a_tenant_sent() -> None:
    program = Program("p", "b", 0.0, CompoundSLO(30.0),
                      (Stage((LLMCall(10, 5), LLMCall(20, 5))),))
    items = [Request("r1", "a", DeadlineSLO(5.0), 100, 0.0, output_tokens=50),
             Request("r2", "a", DeadlineSLO(5.0), 10, 1.0, output_tokens=5), program]
    assert offered_tokens_by_tenant(items) == {"a": 165, "b": 40}
