"""GMAX's token objective: one value per token across kinds, nothing for a late start
(issue 16)."""

from __future__ import annotations

import pytest

from jitserve.policy import load_policy
from jitserve.scheduling.priorities import Speeds, score
from jitserve.slo import DeadlineSLO, LatencySLO

from .conftest import live


@pytest.mark.parametrize("objective", ["tokens", "requests"])
def test_latency_and_deadline_work_of_equal_length_are_worth_the_same(objective: str) -> None:
    spec = load_policy({"objective": objective})
    deadline = live("d", prompt=2000, output=100, slo=DeadlineSLO(60))
    latency = live("l", prompt=2000, output=100, slo=LatencySLO(2.0, 0.1))
    scores = score([deadline, latency], 0.0, Speeds(decode_s=0.02, prefill_s=1e-4), spec, {}, set())
    assert scores.gain[0] == pytest.approx(scores.gain[1])
    assert scores.priority[0] == pytest.approx(scores.priority[1])
    if objective == "tokens":
        assert scores.gain[1] == pytest.approx(2100)  # its prompt counts too


def test_a_latency_request_whose_first_token_would_be_late_earns_nothing() -> None:
    spec = load_policy({"objective": "tokens"})
    # TTFT 0.5 s; 1.0 s of prefill ahead: the first token is late, later ones could catch up
    late = live("late", prompt=10000, output=200, slo=LatencySLO(0.5, 0.1))
    on_time = live("on-time", prompt=1000, output=200, slo=LatencySLO(0.5, 0.1))
    started = live("started", prompt=10000, output=200, slo=LatencySLO(0.5, 0.1), generated=5)
    speeds = Speeds(decode_s=0.02, prefill_s=1e-4)
    scores = score([late, on_time, started], 0.0, speeds, spec, {}, set())
    assert scores.gain[0] == 0.0
    assert scores.gain[1] > 0.0
    assert scores.gain[2] > 0.0  # a begun stream keeps what can still be on time
