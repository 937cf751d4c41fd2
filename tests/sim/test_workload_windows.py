"""The seed picks the trace window: different seeds replay different traffic, the same
seed the same traffic (issue 16: seeds used to replay the trace's first rows)."""

from __future__ import annotations

from dataclasses import replace

from jitserve.requests import Request
from jitserve.sim.workload import WorkloadSpec, generate, load_trace, window_offset


def _traffic(spec: WorkloadSpec) -> list[tuple[float, int, int]]:
    return [
        (round(item.arrival_s, 9), item.prompt_tokens, item.output_tokens)
        for item in generate(spec)
        if isinstance(item, Request)
    ]


def test_two_seeds_replay_different_windows() -> None:
    base = WorkloadSpec(mix=(1.0, 0.0, 0.0), duration_s=60, rate_per_s=4.0)
    one, two = replace(base, seed=1), replace(base, seed=2)
    assert window_offset(one) != window_offset(two)
    first, second = _traffic(one), _traffic(two)
    assert [t[1:] for t in first[:50]] != [t[1:] for t in second[:50]]
    assert [t[0] for t in first[:50]] != [t[0] for t in second[:50]]


def test_same_seed_same_traffic() -> None:
    spec = WorkloadSpec(duration_s=60, rate_per_s=4.0, seed=5)
    assert _traffic(spec) == _traffic(replace(spec))
    assert [item.tenant for item in generate(spec)] == [item.tenant for item in generate(spec)]


def test_window_lengths_come_from_the_window_rows() -> None:
    trace = load_trace("azure-conv")
    spec = WorkloadSpec(mix=(1.0, 0.0, 0.0), duration_s=30, rate_per_s=2.0, window_offset=1234)
    got = _traffic(spec)[:5]
    assert [(p, o) for _, p, o in got] == [
        (int(trace.prompt_tokens[1234 + i]), int(trace.output_tokens[1234 + i])) for i in range(5)
    ]


def test_window_arrives_at_the_asked_rate_and_wraps() -> None:
    rows = len(load_trace("azure-conv").arrival_s)
    for offset in (0, rows - 100):  # the second wraps past the trace's end
        spec = WorkloadSpec(
            mix=(1.0, 0.0, 0.0), duration_s=120, rate_per_s=5.0, window_offset=offset
        )
        count = len(_traffic(spec))
        assert abs(count - 600) <= 2
