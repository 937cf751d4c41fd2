"""The waiting table: queue order, features kept in columns, and the array form of the
overload rule giving the same answers as the rule itself."""

from __future__ import annotations

import numpy as np
import pytest

from jitserve.policy import SLOPolicySpec
from jitserve.requests import LiveProgram, LiveRequest, LLMCall, Program, Request, Stage
from jitserve.scheduling.baselines.keyed import KeyInput, KeySpeeds
from jitserve.scheduling.registry import BASELINES
from jitserve.scheduling.slack import late_to_start, out_of_reach
from jitserve.scheduling.table import (
    WaitingTable,
    features_of,
    late_to_start_rows,
    out_of_reach_rows,
)
from jitserve.slo import CompoundSLO, DeadlineSLO, LatencySLO
from tests.support.requests import live


def mixed(n: int, seed: int) -> list[LiveRequest]:
    rng = np.random.default_rng(seed)
    stages = (Stage((LLMCall(10, 10),)), Stage((LLMCall(10, 10),)))
    program = LiveProgram(Program("p", "t", 1.0, CompoundSLO(30.0), stages))
    program.stage, program.stage_share, program.prev_stage_share = 1, 0.8, 0.4
    out = []
    for i in range(n):
        kind = i % 3
        slo = LatencySLO(2.0, 0.1) if kind == 0 else DeadlineSLO(float(rng.uniform(1, 30)))
        req = Request(f"r{i}", f"t{i % 2}", slo if kind < 2 else CompoundSLO(30.0),
                      int(rng.integers(1, 60000)), float(rng.uniform(0, 10)))
        r = LiveRequest(req, program=program if kind == 2 else None)
        r.bound = int(rng.integers(1, 500))
        r.generated = int(rng.integers(0, r.bound))
        r.first_token_s = None if rng.random() < 0.5 else req.arrival_s + 1
        out.append(r)
    return out


def test_the_array_rule_gives_the_answers_of_out_of_reach() -> None:
    rs = mixed(300, seed=7)
    for now in (1.0, 5.0, 12.0, 40.0):
        rows = out_of_reach_rows(features_of(rs), now, 1e-4, 0.03)
        expected = [out_of_reach(r, now, 1e-4, 0.03) for r in rs]
        assert rows.tolist() == expected


def test_the_array_rule_gives_the_answers_of_late_to_start() -> None:
    rs = mixed(300, seed=11)
    for r in rs[::4]:
        r.expected = r.bound // 2  # the typical length, where the estimator gives one
    answers = set()
    for now in (1.0, 5.0, 12.0, 40.0):
        rows = late_to_start_rows(features_of(rs), now, 1e-4, 0.03)
        expected = [late_to_start(r, now, 1e-4, 0.03) for r in rs]
        assert rows.tolist() == expected
        answers.update(expected)
    assert answers == {True, False}


def test_the_table_pops_in_key_order_ties_to_the_first_pushed() -> None:
    table = WaitingTable(capacity=2)  # grows
    rs = [live(f"r{i}") for i in range(6)]
    for r, key in zip(rs, [3.0, 1.0, 2.0, 1.0, 0.5, 2.0], strict=True):
        table.push(r, key)
    table.remove(rs[4])
    assert [r.req.request_id for r in table.head(3)] == ["r1", "r3", "r2"]
    popped = [table.pop() for _ in range(5)]
    assert [r.req.request_id for r in popped if r] == ["r1", "r3", "r2", "r5", "r0"]
    assert table.pop() is None and len(table) == 0


def test_columns_follow_their_rows_through_removals() -> None:
    table = WaitingTable()
    rs = mixed(40, seed=3)
    for i, r in enumerate(rs):
        table.push(r, float(i))
    for r in rs[::3]:
        table.remove(r)
    kept = [r for r in rs if r not in rs[::3]]
    assert sorted(table.rows, key=lambda r: r.req.request_id) == sorted(
        kept, key=lambda r: r.req.request_id
    )
    mine, theirs = table.features(), features_of(table.rows)
    for name in ("arrival", "prefill_left", "deadline", "whole_deadline", "remaining"):
        assert getattr(mine, name).tolist() == getattr(theirs, name).tolist()


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_a_baselines_key_does_not_depend_on_the_batch(name: str) -> None:
    """A key is written once, over arrays: a request's key in a batch of 200 is its key
    alone (an arrival is keyed alone, the table at a frame)."""
    policy = BASELINES[name](SLOPolicySpec(), None)
    rs = mixed(200, seed=11)
    for r in rs:
        r.expected = r.bound * 0.7
    speeds = KeySpeeds(prefill_s=2e-4, decode_s=0.02)
    keys = policy.keys(KeyInput(features_of(rs), rs, 12.0, speeds))
    alone = [policy.keys(KeyInput(features_of([r]), [r], 12.0, speeds))[0] for r in rs]
    assert keys.tolist() == alone
    assert len(set(alone)) > 1
