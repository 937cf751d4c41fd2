"""The simulator's stdout table: columns aligned whatever the policy names, a legend with
the units under it."""

from __future__ import annotations

from typing import Any

from jitserve.bench import report


def _row(policy: str, goodput: float) -> dict[str, Any]:
    pcts = {"p50": 0.5, "p99": 1.5}
    return {"scenario": "", "load": 1.5, "policy": policy, "token_goodput": goodput,
            "request_goodput": 2.0, "attainment": {k: 0.9 for k in report.KINDS},
            "ttft_s": pcts, "tbt_s": pcts, "e2el_s": pcts, "throughput_tokens_per_s": 900.0,
            "preemptions": 3, "retired": 1, "sched_ms_p99": float("nan")}


def test_columns_stay_aligned_with_long_policy_names() -> None:
    text = report.table([_row("gmax", 800), _row("sarathi-edf-ac-budget-2048", 700)])
    lines = text.splitlines()
    header, rule, *rows, legend = lines
    assert len(rows) == 2 and all(len(row) == len(header) == len(rule) for row in rows)
    assert rows[0].index("800") == rows[1].index("700")  # the same column
    assert legend == report.TABLE_LEGEND and "seconds" in legend and "ms" in legend
    assert rows[0].rstrip().endswith("-")  # nothing measured is a dash, not nan


def test_twenty_policies_get_twenty_looks() -> None:
    names = [f"policy-{i}" for i in range(19)] + [report.UPPER_BOUND]
    styles = report.policy_styles(names)
    looks = {(s["color"], s["marker"]) for s in styles.values()}
    assert len(looks) == len(names)
    colours = [styles[n]["color"] for n in names[:-1]]
    assert len(set(colours)) == len(colours)  # no colour repeats below 20
