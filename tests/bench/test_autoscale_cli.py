"""``jitserve bench --autoscale``: clear errors (exit 2) for bad flags, and one small
pool run per strategy into the table, JSON and plot."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from jitserve.bench import autoscale_report
from jitserve.bench.autoscale import (
    KEDA,
    PLANNER,
    STATIC_PEAK,
    AutoscaleCell,
    ForesightPlanner,
    pool_base,
    run_autoscale_cell,
)
from jitserve.cli import main
from jitserve.policy import SLOPolicySpec
from jitserve.policy.autoscaling import AutoscalingSettings
from jitserve.scaling.planner import SLOPlanner
from jitserve.scaling.signals import PoolSignals
from jitserve.sim.traffic import RateShape
from jitserve.sim.workload import WorkloadSpec


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--autoscale", "weekly"], "unknown shape 'weekly'"),
        (["--autoscale", "day", "--peak-replicas", "0"], "--peak-replicas must be > 0"),
        (["--autoscale", "day", "--warmup", "-1"], "--warmup must be >= 0"),
        (["--autoscale", "day", "--target-attainment", "1.5"], "--target-attainment must be"),
    ],
)
def test_bad_autoscale_flags_exit_2_with_a_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code = main(["bench", "--duration", "10", "--jobs", "1", "--out", str(tmp_path), *args])
    assert code == 2
    assert message in capsys.readouterr().err


def test_one_small_day_per_strategy_into_the_report(tmp_path: Path) -> None:
    settings = AutoscalingSettings(enabled=True, max_replicas=8, warmup_seconds=20.0,
                                   period_seconds=10.0, replica_capacity=2.9)
    base = AutoscaleCell(
        PLANNER, "day", 1, WorkloadSpec(trace="azure-conv", duration_s=240.0), 12.0,
        "a100-llama3-8b", SLOPolicySpec(), settings, 20.0, replicas=2,
    )
    rows = [run_autoscale_cell(replace(base, strategy=s, replicas=5 if s == STATIC_PEAK else 2))
            for s in (STATIC_PEAK, KEDA, PLANNER)]
    by = {r["strategy"]: r for r in rows}
    assert by[STATIC_PEAK]["replica_seconds"] == pytest.approx(5 * 240.0)
    assert by[STATIC_PEAK]["changes"] == 0
    assert by[PLANNER]["max_replicas"] > 2  # the day's peak made it add replicas
    for row in rows:
        assert row["requests"] > 100 and 0 <= row["attainment"] <= 1
        assert row["timeline"] and row["timeline"][0][0] > 0
    meta = {"trace": "azure-conv", "duration_s": 240.0, "peak_replicas": 4.0,
            "peak_rate_per_s": 12.0, "warmup_s": 20.0, "target_attainment": 0.95,
            "seeds": [1]}
    autoscale_report.write(tmp_path, meta, rows, [])
    table = (tmp_path / "autoscale.md").read_text()
    assert "| day | jitserve |" in table and "replica-s / KEDA" in table
    saved = json.loads((tmp_path / "autoscale.json").read_text())
    verdict = saved["verdicts"][0]
    assert verdict["replica_seconds_vs_peak"] == pytest.approx(
        by[PLANNER]["replica_seconds"] / by[STATIC_PEAK]["replica_seconds"])
    assert (tmp_path / "autoscale.png").stat().st_size > 10_000


def test_foresight_sizes_for_a_burst_a_warm_up_before_it_begins() -> None:
    """The ceiling row: told the shape, the planner asks for a burst's replicas while the
    rate is still flat; the plain planner, on the same signals, does not."""
    settings = AutoscalingSettings(enabled=True, max_replicas=50, utilization=0.5,
                                   warmup_seconds=60.0, replica_capacity=2.0)
    shape = RateShape("bursts", 3600.0)
    ramp = 0.2 * 3600.0  # the first burst's ramp begins
    plain, told = SLOPlanner(settings), ForesightPlanner(settings, shape)
    for at in (ramp - 120.0, ramp - 105.0, ramp - 90.0, ramp - 75.0, ramp - 60.0):
        flat = PoolSignals(at_s=at, period_s=15.0, ready=4, warming=0, arrived=60)
        asked_plain, asked_told = plain.decide(flat).desired, told.decide(flat).desired
    # 4/s at 2/s per replica and utilization 0.5: 4 replicas; 75 s ahead the ramp is
    # half-way (0.4 -> 0.7 of the peak): 1.75x that
    assert asked_plain == 4
    assert asked_told == 7


def test_foresight_with_notice_is_told_only_once_the_rise_has_begun() -> None:
    settings = AutoscalingSettings(enabled=True, max_replicas=50, utilization=0.5,
                                   warmup_seconds=60.0, replica_capacity=2.0)
    shape = RateShape("bursts", 3600.0)
    ramp = 0.2 * 3600.0
    late = ForesightPlanner(settings, shape, notice_s=0.0)
    for at in (ramp - 45.0, ramp - 30.0, ramp - 15.0, ramp):
        asked = late.decide(PoolSignals(at_s=at, period_s=15.0, ready=4, warming=0,
                                        arrived=60)).desired
    assert asked == 4  # at the ramp's first instant nothing has risen yet
    # a period in, told the course: from 0.7 of the peak to the peak, 1/0.7 of the level
    rising = PoolSignals(at_s=ramp + 15.0, period_s=15.0, ready=4, warming=0, arrived=60)
    assert late.decide(rising).desired == 6


def test_the_pools_run_the_engine_the_command_line_changed() -> None:
    """``--max-num-seqs`` / ``--budget`` reach every pool's replicas, not only the capacity
    measurement: one sequence at a time serves less of the same traffic."""
    settings = AutoscalingSettings(enabled=True, max_replicas=4, replica_capacity=2.9)
    base = AutoscaleCell(
        STATIC_PEAK, "", 1, WorkloadSpec(trace="azure-conv", duration_s=60.0), 3.0,
        "a100-llama3-8b", SLOPolicySpec(), settings, 20.0, replicas=1,
    )
    default = run_autoscale_cell(base)
    one_slot = run_autoscale_cell(replace(base, profile_overrides=(("max_running", 1),)))
    assert one_slot["met"] < default["met"]
    assert pool_base(WorkloadSpec(trace="azure-conv", duration_s=60.0), "a100-llama3-8b",
                     SLOPolicySpec(), (("max_running", 1),)).profile_overrides == (
        ("max_running", 1),)
