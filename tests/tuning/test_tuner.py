"""The tuner (issue 31): its record sees only the past, a policy switch loses no request,
and it switches to the policy that earns more, only then."""

from __future__ import annotations

from dataclasses import replace

import pytest

from jitserve.bench.capacity import measure_capacity
from jitserve.bench.runner import Cell, run_one
from jitserve.bench.variants import make_setup
from jitserve.policy import SLOPolicySpec
from jitserve.requests import LiveRequest, Phase, Program, Request
from jitserve.scheduling.gmax import GMAX
from jitserve.scheduling.gmax.cutoff import CutoffTuner
from jitserve.scheduling.registry import make_policy
from jitserve.serving.traffic import TrafficRecord
from jitserve.sim.engine import Engine
from jitserve.sim.latency import load_profile
from jitserve.sim.workload import WorkloadSpec, generate
from jitserve.slo import CompoundSLO, DeadlineSLO
from jitserve.tuning.tuner import Trial, Tuner, with_auto

SPEC = SLOPolicySpec()
WORKLOAD = WorkloadSpec(trace="azure-conv", duration_s=90.0, slo=SPEC.slo_defaults)


def _live(req: Request, generated: int, expected: float, phase: Phase) -> LiveRequest:
    r = LiveRequest(req=req, phase=phase, generated=generated)
    r.expected = expected
    return r


def test_the_record_rebuilds_a_window_from_the_past_only() -> None:
    record = TrafficRecord(keep_s=60.0)
    done = _live(Request("done", "t", DeadlineSLO(20.0), 100, 5.0, output_tokens=40), 40, 90.0,
                 Phase.FINISHED)
    running = _live(Request("run", "t", DeadlineSLO(20.0), 100, 6.0, output_tokens=900), 12,
                    50.0, Phase.RUNNING)
    record.arrived(done, 5.0)
    record.finished(done, 9.0)
    record.arrived(running, 6.0)
    slo = CompoundSLO(60.0)
    calls = [Request(f"p/{s}/{i}", "t", slo, 50, at, output_tokens=300, program_id="p", stage=s)
             for s, i, at in ((0, 0, 7.0), (0, 1, 7.0), (1, 0, 15.0))]
    lives = [_live(c, 20, 30.0, Phase.FINISHED) for c in calls[:2]]
    lives.append(_live(calls[2], 0, 30.0, Phase.WAITING))
    for r, at, end in zip(lives, (7.0, 7.0, 15.0), (11.0, 12.0, None), strict=True):
        record.arrived(r, at)
        if end is not None:
            record.finished(r, end)
    old = _live(Request("old/1/0", "t", slo, 50, 1.0, output_tokens=5, program_id="old",
                        stage=1), 5, 5.0, Phase.FINISHED)
    record.arrived(old, 4.5)  # a later stage of a program that began before the window

    items = record.window(4.0, 20.0)

    requests = {i.request_id: i for i in items if isinstance(i, Request)}
    assert requests["done"].output_tokens == 40  # what it produced
    assert requests["run"].output_tokens == 50  # the estimate, never the truth (900)
    assert requests["done"].arrival_s == pytest.approx(1.0)  # shifted to the window
    (program,) = [i for i in items if isinstance(i, Program)]
    assert program.program_id == "p" and program.arrival_s == pytest.approx(3.0)
    assert [len(s.calls) for s in program.stages] == [2, 1]
    assert program.stages[0].tool_s == pytest.approx(3.0)  # 15 - the stage's last end, 12
    assert [c.output_tokens for c in program.stages[1].calls] == [30]
    assert [i.arrival_s for i in items] == sorted(i.arrival_s for i in items)
    assert record.window(70.0, 80.0) == [] and len(record) == 0  # forgotten past keep_s


def test_the_record_keeps_when_a_request_arrived_not_when_the_engine_took_it() -> None:
    record = TrafficRecord(keep_s=60.0)
    r = _live(Request("x", "t", DeadlineSLO(20.0), 100, 5.0, output_tokens=40), 0, 40.0,
              Phase.WAITING)
    record.arrived(r, 5.3)  # the end of the step it came in
    (item,) = record.window(4.0, 20.0)
    assert item.arrival_s == pytest.approx(1.0)


def test_switching_policy_mid_run_loses_and_duplicates_no_request() -> None:
    """Every work item has exactly one outcome though the policy changes every few
    arrivals, between chunked and prefill-first batching too."""
    profile = load_profile()
    workload = replace(WORKLOAD, rate_per_s=2.0 * measure_capacity(profile, WORKLOAD), seed=3)
    items = list(generate(workload))
    setup = make_setup("gmax", SPEC)
    engine = Engine(profile, setup.policy, setup.estimator, setup.stage_share)
    names = ["fcfs", "edf-ac", "gmax", "sarathi-ac", "lsf-ac"]
    switched = 0
    for i, item in enumerate(items):
        engine.advance_until(item.arrival_s)
        if i % 25 == 24:
            engine.switch_policy(make_policy(SPEC, name=names[switched % len(names)]))
            switched += 1
        engine.submit(item)
    engine.advance_until(float("inf"))
    assert switched > 10
    assert engine.live == 0
    assert engine.ledger.overall.requests == len(items)


def test_a_switch_back_resumes_the_scheduler_as_the_replica_left_it() -> None:
    """GMAX switched away from at overload and back is the same GMAX: the pacer's rate it
    learned kept, nothing kept about the requests another scheduler ran meanwhile, and
    every work item still has one outcome."""
    profile = load_profile()
    workload = replace(WORKLOAD, rate_per_s=2.0 * measure_capacity(profile, WORKLOAD), seed=4)
    items = list(generate(workload))
    setup = make_setup("gmax", SPEC)
    engine = Engine(profile, setup.policy, setup.estimator, setup.stage_share)
    gmax = engine.policy
    assert isinstance(gmax, GMAX) and gmax.pacer is not None
    third = len(items) // 3
    for i, item in enumerate(items):
        engine.advance_until(item.arrival_s)
        if i == third:
            rate = gmax.pacer.rate
            assert engine.lifecycle.resumable("edf-ac", SPEC) is None  # never ran here
            engine.switch_policy(make_policy(SPEC, name="edf-ac"))
            assert not (gmax.kept.priority or gmax.kept.waited or gmax.queue.rows)
        if i == 2 * third:
            back = engine.lifecycle.resumable("gmax", SPEC)
            assert back is gmax and gmax.pacer.rate == rate
            engine.switch_policy(back)
            assert engine.lifecycle.resumable("gmax", SPEC) is None  # taken off the shelf
        engine.submit(item)
    engine.advance_until(float("inf"))
    assert engine.policy is gmax and engine.live == 0
    assert engine.ledger.overall.requests == len(items)


def test_a_cutoff_epoch_cut_by_another_scheduler_is_not_scored() -> None:
    """The epoch under way when GMAX resumes is dropped: its frames were not all the
    cutoff's. Unscored, the tuner stays on its value for a whole new epoch."""
    tuner = CutoffTuner([0.5, 0.9], start=0.5, epoch_frames=2)
    tuner.on_frame(0.0)
    tuner.earned(100.0)
    tuner.restart_epoch()
    tuner.on_frame(60.0)
    assert tuner.value == 0.5  # one frame into the new epoch, nothing scored yet
    tuner.on_frame(61.0)
    assert tuner.value == 0.9  # scored, it tries the candidate it has not yet


def _cell(policy: str, spec: SLOPolicySpec = SPEC, load: float = 1.8) -> Cell:
    profile = load_profile()
    capacity = measure_capacity(profile, WORKLOAD)
    return Cell(policy, load, 2, WORKLOAD, capacity, profile.name, spec)


def test_auto_switches_to_the_policy_that_earns_more() -> None:
    """Started on raw FCFS at overload, the tuner finds GMAX earns more on the traffic
    it saw, switches, and the run earns more than FCFS's."""
    spec = with_auto(SPEC, candidates=["fcfs", "gmax"], period_seconds=15.0, window_seconds=30.0,
                     memory=1)  # the 90 s run has room for one comparison
    auto = run_one(_cell("auto", spec))
    fcfs = run_one(_cell("fcfs", spec))
    assert auto["auto"]["switches"][0] == [0.0, "fcfs"]
    assert auto["auto"]["switches"][-1][1] == "gmax"
    assert auto["token_goodput"] > 1.1 * fcfs["token_goodput"]
    assert auto["requests"] == fcfs["requests"]


def test_a_tuner_that_never_switches_leaves_the_run_as_the_fixed_policy_runs_it() -> None:
    """The comparisons do not perturb the engine: with one candidate, or a margin no
    candidate beats, auto is the first candidate's run to the token."""
    gmax = run_one(_cell("gmax"))
    alone = run_one(_cell("auto", with_auto(SPEC, candidates=["gmax"], period_seconds=15.0,
                                            window_seconds=30.0)))
    held = run_one(_cell("auto", with_auto(SPEC, candidates=["gmax", "fcfs"], period_seconds=15.0,
                                           window_seconds=30.0, margin=10.0)))
    assert alone["auto"]["comparisons"] > 0 and held["auto"]["comparisons"] > 0
    assert len(held["auto"]["switches"]) == 1
    for row in (alone, held):
        assert row["token_goodput"] == gmax["token_goodput"]
        assert row["frames"] == gmax["frames"]


def test_a_candidate_takes_over_only_having_won_each_window_of_the_memory() -> None:
    """One window far ahead carries a sum, not a switch; nor does anything before the
    memory is full."""
    spec = with_auto(SPEC, candidates=["gmax", "sjf-ac"], memory=3, margin=0.05)
    tuner = Tuner(spec, load_profile())

    def window(gmax: float, sjf: float) -> str:
        trials = (Trial("gmax", gmax, 0, 50), Trial("sjf-ac", sjf, 0, 50))
        return tuner.decide(trials, "gmax", 0.0, 0.0).choice

    assert window(100, 300) == "gmax"  # one window: no memory yet
    assert window(100, 300) == "gmax"
    assert window(100, 90) == "gmax"  # 2.3x the sum, but it lost this window
    assert window(100, 110) == "gmax"
    assert window(100, 120) == "gmax"  # the lost window is still in the memory
    assert window(100, 130) == "sjf-ac"  # won each of the last three: 360 > 1.05 x 300


def test_tuner_settings_refuse_unknown_candidates_and_bad_numbers() -> None:
    with pytest.raises(ValueError, match="nope"):
        with_auto(SPEC, candidates=["gmax", "nope"])
    with pytest.raises(ValueError, match="repeat"):
        with_auto(SPEC, candidates=["gmax", "gmax"])
    with pytest.raises(ValueError, match="margin"):
        with_auto(SPEC, margin=-0.1)
    with pytest.raises(ValueError, match="period_seconds"):
        with_auto(SPEC, period_seconds=0)


def test_no_comparison_before_a_full_warm_up_and_window_of_history() -> None:
    spec = with_auto(SPEC, candidates=["fcfs", "gmax"], period_seconds=10.0,
                     window_seconds=60.0, warmup_seconds=30.0)
    row = run_one(_cell("auto", spec))
    assert row["auto"]["comparisons"] == 0  # 90 s of traffic: no tick at or after 90 s
    assert row["auto"]["switches"] == [[0.0, "fcfs"]]


def test_the_bench_refuses_an_unknown_candidate_with_a_message(
        capsys: pytest.CaptureFixture[str]) -> None:
    from jitserve.cli import main

    assert main(["bench", "--policies", "auto", "--auto-candidates", "gmax,nope",
                 "--duration", "5", "--out", "/nonexistent/never-written"]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "Traceback" not in err
