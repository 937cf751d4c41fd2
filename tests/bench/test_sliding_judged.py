"""The issue-26 tables' arithmetic: the operator's one budget and the verdicts."""

from __future__ import annotations

from typing import Any

from scripts.sliding_judged import FIXED, choose_budget, compare


def _rows(goodput: dict[tuple[str, int], tuple[float, float]]) -> list[dict[str, Any]]:
    return [{"scenario": s, "load": 1.5, "config": f"gmax fixed-{b}", "seed": seed,
             "token_goodput": t, "request_goodput": r}
            for (s, b), (t, r) in goodput.items() for seed in (1, 2)]


def test_the_operators_budget_is_the_best_across_cells_not_the_best_in_one() -> None:
    # 512 wins cell x by a hair and loses cell y badly; 1024 is close to best in both
    goodput = {("x", b): (100.0, 10.0) for b in FIXED} | {("y", b): (100.0, 10.0) for b in FIXED}
    goodput[("x", 512)] = (101.0, 10.1)
    goodput[("y", 512)] = (50.0, 5.0)
    goodput[("x", 1024)] = (100.5, 10.05)
    goodput[("y", 1024)] = (100.5, 10.05)
    chosen, why = choose_budget(_rows(goodput), "gmax")
    assert chosen == 1024, why
    assert "512: 0.7" in why


def test_compare_judges_only_the_loads_it_is_told_to() -> None:
    rows = [{"scenario": "x", "load": load, "config": c, "seed": 1,
             "token_goodput": t, "request_goodput": t / 100}
            for load, c, t in ((1.0, "new", 90.0), (1.0, "ref", 100.0),
                               (2.0, "new", 120.0), (2.0, "ref", 100.0))]
    text = compare(rows, [("new", "ref")], 1.1, 1.5)
    assert "| x | 1.0 | new | ref | 90 | 0.90 | 100 | 1.00 | 0.900 | 0.900 |" in text
    assert "2 of 2 ratios >= 1.1x (minimum 1.200" in text
    assert "2 of 4 ratios" in compare(rows, [("new", "ref")], 1.1, 0.0)
