"""Budget rules (jitserve.scheduling.budget): fixed, greedy and SlidingChunker."""

from __future__ import annotations

from jitserve.scheduling.budget import (
    BudgetRule,
    DecodeSlack,
    Window,
    best_split,
    choose_budget,
    sliding_prefill,
    time_to_budget,
)


def convex(p: int) -> float:
    """A memory-bound floor (20 ms up to ~1000 tokens) then 0.1 ms a token."""
    return max(0.020 + 0.000002 * p, 0.0001 * p - 0.080)


def test_time_to_budget_inverts_the_predictor() -> None:
    assert time_to_budget(convex, 0.020 + 0.000002 * 500, 4096) == 500
    assert time_to_budget(convex, 0.5, 4096) == 4096
    assert time_to_budget(convex, 0.010, 4096) == 0
    b = time_to_budget(convex, 0.150, 4096)
    assert convex(b) <= 0.150 < convex(b + 1)


def test_best_split_minimises_the_two_steps_and_takes_the_larger_on_ties() -> None:
    b, t = best_split(convex, 4000, 0, 4000)
    assert t == convex(b) + convex(4000 - b) <= 2 * convex(2000) + 1e-12
    assert t < convex(4000) + convex(0)  # not all in one step: past the floor, both
    b, _ = best_split(convex, 600, 0, 600)  # both halves on the flat floor: no split
    assert b == 600


def test_fixed_and_no_protected_decode_give_the_maximum() -> None:
    tight = [DecodeSlack(0.05, 0.1)]
    assert choose_budget(BudgetRule.FIXED, convex, tight, decoders=1, most=4096,
                         demand=9999) == 4096
    untimed = [DecodeSlack(0.001, 0.0)]  # no TBT target: not protected
    assert choose_budget(BudgetRule.GREEDY, convex, untimed, decoders=1, most=4096,
                         demand=9999) == 4096
    assert choose_budget(BudgetRule.SLIDING, None, tight, decoders=1, most=4096,
                         demand=9999) == 4096


def test_a_late_decode_holds_each_step_to_half_its_tbt() -> None:
    late = [DecodeSlack(-0.5, 0.2)]  # behind its schedule: it catches up on short steps
    budget = choose_budget(BudgetRule.GREEDY, convex, late, decoders=1, most=4096,
                           demand=9999)
    assert convex(budget - 1) <= 0.1 < convex(budget)


def test_a_late_decode_too_far_behind_for_its_tokens_left_is_not_protected() -> None:
    # 0.5 s behind; held to 0.1 s steps against a 0.2 s TBT it gains 0.1 s a token
    for left, protected in ((6, True), (5, True), (4, False), (None, True)):
        late = [DecodeSlack(-0.5, 0.2, left)]
        assert late[0].hopeless() is not protected
        budget = choose_budget(BudgetRule.GREEDY, convex, late, decoders=1, most=4096,
                               demand=9999)
        assert (budget < 4096) is protected, (left, budget)
    assert not DecodeSlack(0.01, 0.2, 1).hopeless()  # on time: never hopeless


def test_a_late_decode_the_engine_is_too_slow_for_is_not_protected() -> None:
    late = [DecodeSlack(-0.5, 0.03)]  # half its TBT (15 ms) < a decode-only step (20 ms)
    assert choose_budget(BudgetRule.SLIDING, convex, late, decoders=1, most=4096,
                         demand=9999) == 4096


def test_greedy_fills_this_step_to_the_tightest_slack() -> None:
    decodes = [DecodeSlack(0.150, 0.1), DecodeSlack(0.3, 0.1)]
    budget = choose_budget(BudgetRule.GREEDY, convex, decodes, decoders=2, most=4096,
                           demand=9999)
    assert convex(budget - 2) <= 0.150 < convex(budget - 1)


def test_sliding_leaves_the_next_step_room_and_takes_more_over_the_window() -> None:
    window = Window(now_s=0.150, next_s=0.170)  # the token after next is due 20 ms later
    greedy = time_to_budget(convex, window.now_s, 4096)
    greedy_next = time_to_budget(convex, window.next_s - convex(greedy), 4096)
    b = sliding_prefill(convex, window, 4096, demand=99999)
    assert b < greedy and convex(b) <= window.now_s
    rest = time_to_budget(convex, window.next_s - convex(b), 4096)
    assert b + rest > greedy + greedy_next  # more prompt tokens by the second deadline


def test_sliding_takes_the_whole_demand_when_it_fits() -> None:
    window = Window(now_s=0.150, next_s=0.250)
    assert sliding_prefill(convex, window, 4096, demand=300) == 300
