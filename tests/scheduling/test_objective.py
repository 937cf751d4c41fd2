"""GMAX's objective: each kind at the metric's value, nothing for a late start (issue 16)."""

from __future__ import annotations

import pytest

from jitserve.policy import SLOPolicySpec, load_policy
from jitserve.requests import LiveRequest
from jitserve.scheduling.gmax.priorities import ScoreAt, score_features
from jitserve.scheduling.scores import Scores, Speeds
from jitserve.scheduling.table import features_of
from jitserve.slo import DeadlineSLO, LatencySLO
from tests.support.requests import live


def score(rs: list[LiveRequest], speeds: Speeds, spec: SLOPolicySpec) -> Scores:
    return score_features(features_of(rs), ScoreAt(0.0, speeds, spec))


def test_each_kind_is_worth_what_the_goodput_metric_counts_for_it() -> None:
    deadline = live("d", prompt=2000, output=100, slo=DeadlineSLO(60))
    latency = live("l", prompt=2000, output=100, slo=LatencySLO(2.0, 0.1))
    speeds = Speeds(decode_s=0.02, prefill_s=1e-4)
    tokens = score([deadline, latency], speeds, load_policy({}))
    assert tokens.gain[0] == pytest.approx(2100)  # prompt + output, on time
    assert tokens.gain[1] == pytest.approx(100)  # its on-time output tokens
    requests = score([deadline, latency], speeds, load_policy({"objective": "requests"}))
    assert requests.gain[0] == pytest.approx(requests.gain[1]) == pytest.approx(1.0)


def test_a_latency_request_whose_first_token_would_be_late_earns_nothing() -> None:
    spec = load_policy({"objective": "tokens"})
    # TTFT 0.5 s; 1.0 s of prefill ahead: the first token is late, later ones could catch up
    late = live("late", prompt=10000, output=200, slo=LatencySLO(0.5, 0.1))
    on_time = live("on-time", prompt=1000, output=200, slo=LatencySLO(0.5, 0.1))
    started = live("started", prompt=10000, output=200, slo=LatencySLO(0.5, 0.1), generated=5)
    speeds = Speeds(decode_s=0.02, prefill_s=1e-4)
    scores = score([late, on_time, started], speeds, spec)
    assert scores.gain[0] == 0.0
    assert scores.gain[1] > 0.0
    assert scores.gain[2] > 0.0  # a begun stream keeps what can still be on time
