"""SlidingServe's BatchConstructor (scheduling.constructor) and the engine running it."""

from __future__ import annotations

from jitserve.scheduling.budget.constructor import Candidate, construct


def linear(p: int) -> float:
    return 0.01 + 0.0001 * p  # 10 ms + 0.1 ms per prompt token


def test_no_prefill_at_risk_keeps_the_full_batch() -> None:
    cands = [Candidate(1000, 5.0), Candidate(2000, 4.0)]
    assert construct(linear, cands, 4096, 3000) is None  # 310 ms: every slack covers it


def test_an_at_risk_prefill_anchors_a_smaller_batch_it_finishes_in() -> None:
    # the full batch (3000 tokens) takes 310 ms; "urgent" has 150 ms, so the batch is cut
    # to what fits in 150 ms (1400 prompt tokens): urgent (500) and the short one (800)
    # complete, the long one waits; the already-late one is no anchor
    cands = [Candidate(1700, 9.0), Candidate(500, 0.15), Candidate(800, 3.0),
             Candidate(300, -1.0)]
    picked = construct(linear, cands, 4096, 3000)
    assert picked is not None and sorted(picked) == [1, 2]
    assert linear(sum(cands[i].remaining for i in picked)) <= 0.15


def test_an_infeasible_anchor_is_no_solution() -> None:
    cands = [Candidate(3000, 0.05), Candidate(100, 5.0)]  # 3000 tokens cannot fit 50 ms
    assert construct(linear, cands, 4096, 3100) is None
