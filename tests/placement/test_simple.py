"""The comparison placements (vllm-router's policies) on crafted reports, and the
registry."""

from __future__ import annotations

import pytest

from jitserve.errors import CLIError
from jitserve.placement.base import Ask, Pick, Refusal, ReplicaReport
from jitserve.placement.registry import PLACERS, make_placer
from jitserve.slo import DeadlineSLO


def report(name: str, running: int = 0, waiting: int = 0, tokens: int = 0) -> ReplicaReport:
    return ReplicaReport(name, True, 0.0, 8, running, waiting, outstanding_tokens=tokens)


ASK = Ask("a", "t", DeadlineSLO(20.0), 100, 60, 50, 0.0)


def picks(placer_name: str, reports: list[ReplicaReport], n: int) -> list[str]:
    placer = make_placer(placer_name, seed=1)
    out = []
    for _ in range(n):
        choice = placer.place(ASK, reports, 0.0)
        assert isinstance(choice, Pick)
        placer.placed(ASK, choice.replica)
        out.append(choice.replica)
    return out


def test_round_robin_rotates() -> None:
    assert picks("round-robin", [report("a"), report("b"), report("c")], 6) == [
        "a", "b", "c", "a", "b", "c"]  # fmt: skip


def test_least_loaded_counts_what_it_sent_since_the_report() -> None:
    reports = [report("a", tokens=0), report("b", tokens=300)]
    # 150 tokens per request: a takes two before b's 300 tokens are the fewer
    assert picks("least-loaded", reports, 4)[:2] == ["a", "a"]
    assert "b" in picks("least-loaded", reports, 4)


def test_power_of_two_takes_the_fewer_requests_of_two() -> None:
    reports = [report("a", running=5), report("b", running=1)]
    assert picks("power-of-two", reports, 1) == ["b"]


@pytest.mark.parametrize("name", sorted(PLACERS))
def test_every_placement_answers_503_with_no_replica(name: str) -> None:
    choice = make_placer(name).place(ASK, [], 0.0)
    assert isinstance(choice, Refusal) and choice.status == 503


def test_registry_names_power_of_k_and_refuses_unknown_names() -> None:
    assert make_placer("power-of-k").name == "power-of-k"
    with pytest.raises(CLIError, match="unknown placement 'nope'"):
        make_placer("nope")
