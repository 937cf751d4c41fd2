"""A capped workload is the uncapped one shortened: the same arrivals, tenants and SLOs,
prompts and outputs capped, tool time scaled; the live bench and the simulator replay
the same items from one spec."""

from __future__ import annotations

from dataclasses import replace

import pytest

from jitserve.bench.live import live_spec, live_workload
from jitserve.requests import Program, Request
from jitserve.sim.workload import WorkloadSpec, generate, parse_mix


def test_caps_shorten_the_same_items() -> None:
    spec = WorkloadSpec(mix=parse_mix("1:1:1"), arrival="poisson", rate_per_s=5.0,
                        duration_s=60.0, seed=3)
    capped = replace(spec, max_prompt=64, max_output=8, tool_scale=0.1)
    pairs = list(zip(generate(spec), generate(capped), strict=True))
    assert len(pairs) > 100
    for full, short in pairs:
        assert (short.arrival_s, short.tenant) == (full.arrival_s, full.tenant)
        if isinstance(full, Request):
            assert isinstance(short, Request) and short.slo == full.slo
            assert short.prompt_tokens == min(full.prompt_tokens, 64)
            assert short.output_tokens == min(full.output_tokens or 1, 8)
        else:
            assert isinstance(full, Program) and isinstance(short, Program)
            for a, b in zip(full.stages, short.stages, strict=True):
                assert b.tool_s == pytest.approx(a.tool_s * 0.1)
                assert all(c.prompt_tokens <= 64 and c.output_tokens <= 8 for c in b.calls)


def test_the_live_bench_replays_its_spec() -> None:
    assert live_workload(20.0, 3.0, seed=2) == list(generate(live_spec(20.0, 3.0, seed=2)))


def test_a_cap_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_output must be at least 1"):
        WorkloadSpec(max_output=0)
