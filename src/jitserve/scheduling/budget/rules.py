"""Budget rules: how many tokens one engine iteration may schedule (pure; SlidingServe).

The iteration's token budget (vLLM's ``max_num_batched_tokens``, applied per step) is a
latency decision: every decoding request waits for the whole batch, so a large prompt
chunk makes the next token of every decode late, and a small one starves prefill. A rule
maps the state of one step to a budget, given a batch-latency predictor ``step(p)``: the
predicted seconds of this iteration with its decodes fixed and ``p`` prompt tokens added.

- ``fixed``: the engine's maximum, every step (vLLM's behaviour);
- ``greedy``: the largest prompt share that keeps the tightest protected decode within
  its TBT slack this step (single-step SLO check);
- ``sliding`` (SlidingChunker, SlidingServe §4.2): the budget of this step and the next
  are chosen together over a window of two iterations: the window's capacity ``S`` is
  the most prompt tokens two iterations can take before the tightest decode's token
  after next is due (binary search on the predictor: TimeToBudget), and the split
  ``b, S - b`` minimises the two iterations' predicted time (discrete ternary search),
  ``b`` within this step's own slack. Greedy maximises ``b`` and leaves the next step the
  remainder of a slack it has already spent; on a convex predictor (a memory-bound floor
  then a compute-bound slope) an even split takes the same tokens in less time.

Every decode with a TBT target is protected. One whose next token can still be on time
(slack at least a decode-only step) bounds the window by its slack; one already behind
its schedule (goodput counts per token, so it can still catch up: each step shorter than
its TBT gains on the schedule) bounds each step to ``LATE_SHARE`` of its TBT instead of
to a slack it can no longer meet (measured on the simulator: 0.5 beat 1.0 and beat
ignoring late decodes, which let the budget jump to the maximum under overload), unless
even a decode-only step is longer than that: an engine too slow for the target, where a
smaller prompt share would only starve prefill (seen live: a CPU vLLM on an overloaded
machine, 300 ms decode steps against a 100 ms TBT, cut to one prompt token a step), or
it is *hopeless*: further behind than its remaining tokens (its length bound) can catch
up at that pace (seen live: vLLM without admission control at 1.5x its capacity, first
tokens tens of seconds late, such decodes cut 57% of the steps, throughput to 0.77x).
The simulator's engine and the in-engine vLLM scheduler (:mod:`jitserve.engine`) both
call :func:`choose_budget`; the predictor is the calibrated profile in the one and a
model fitted online from measured step times in the other. How vLLM is told to load that
scheduler, and the SLO keys each request carries to it, are :mod:`jitserve.engine.wire`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from jitserve.policy import BudgetRule

__all__ = ["BudgetRule", "DecodeSlack", "Window", "choose_budget", "time_to_budget"]

LATE_SHARE = 0.5
"""A late decode's iterations are held to this share of its TBT (see the module doc)."""

StepTime = Callable[[int], float]
"""Predicted seconds of this iteration with ``p`` prompt tokens beside its decodes."""


@dataclass(frozen=True, slots=True)
class DecodeSlack:
    """One decoding request's time until its next token is due, its TBT target and how
    many tokens it may still produce (its length bound; None: unknown)."""

    slack_s: float
    tbt_s: float
    tokens_left: float | None = None

    def hopeless(self) -> bool:
        """So far behind its schedule that its remaining tokens cannot catch up, even with
        every step held to ``LATE_SHARE`` of its TBT: no budget earns it a token again."""
        if self.tokens_left is None or self.slack_s >= 0:
            return False
        return -self.slack_s > self.tokens_left * self.tbt_s * (1 - LATE_SHARE)


@dataclass(frozen=True, slots=True)
class Window:
    """The two deadlines SlidingChunker works between (seconds from now)."""

    now_s: float
    """Latest end of this iteration (the tightest protected decode's next token)."""
    next_s: float
    """Latest end of the next iteration (the tightest protected token after next)."""

    @staticmethod
    def of(decodes: Iterable[DecodeSlack], floor_s: float) -> Window | None:
        """The window of the decodes with a TBT target (``floor_s``: the time of a
        decode-only step; below it a decode counts as late, and one whose half TBT is
        below it too cannot be helped by any budget: the engine is too slow for it);
        None when there are none."""
        protected = [d if d.slack_s >= floor_s else DecodeSlack(LATE_SHARE * d.tbt_s, d.tbt_s)
                     for d in decodes if d.tbt_s > 0 and not d.hopeless() and
                     (d.slack_s >= floor_s or LATE_SHARE * d.tbt_s >= floor_s)]
        if not protected:
            return None
        return Window(min(d.slack_s for d in protected),
                      min(d.slack_s + d.tbt_s for d in protected))


def time_to_budget(step: StepTime, limit_s: float, most: int) -> int:
    """The largest ``p`` in ``[0, most]`` with ``step(p) <= limit_s`` (binary search;
    ``step`` is non-decreasing); 0 when even ``step(0)`` is over."""
    if most <= 0 or step(0) > limit_s:
        return 0
    if step(most) <= limit_s:
        return most
    lo, hi = 0, most  # step(lo) fits, step(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if step(mid) <= limit_s:
            lo = mid
        else:
            hi = mid
    return lo


def best_split(step: StepTime, total: int, lo: int, hi: int) -> tuple[int, float]:
    """``b`` in ``[lo, hi]`` minimising ``step(b) + step(total - b)`` and that time
    (discrete ternary search: the sum of a convex predictor is unimodal in ``b``); ties
    go to the larger ``b``, so prompt work is not put off for nothing."""

    def cost(b: int) -> float:
        return step(b) + step(total - b)

    while hi - lo > 2:
        m1 = lo + (hi - lo) // 3
        m2 = hi - (hi - lo) // 3
        if cost(m1) < cost(m2):
            hi = m2 - 1
        else:
            lo = m1 + 1
    best = max(range(lo, hi + 1), key=lambda b: (-cost(b), b))
    return best, cost(best)


def sliding_prefill(step: StepTime, window: Window, per_step: int, demand: int) -> int:
    """SlidingChunker's prompt tokens for this iteration (see the module doc)."""
    first = time_to_budget(step, window.now_s, per_step)

    def window_time(total: int) -> float:
        lo, hi = max(0, total - per_step), min(first, total)
        return math.inf if lo > hi else best_split(step, total, lo, hi)[1]

    if window_time(0) > window.next_s:  # the next step cannot fit: act as greedy
        return min(first, demand)
    lo, hi = 0, min(first + per_step, demand)
    if window_time(hi) <= window.next_s:
        lo = hi
    while hi - lo > 1:  # the window's capacity S: window_time is non-decreasing in S
        mid = (lo + hi) // 2
        if window_time(mid) <= window.next_s:
            lo = mid
        else:
            hi = mid
    total = lo
    return best_split(step, total, max(0, total - per_step), min(first, total))[0]


def choose_budget(rule: BudgetRule, step: StepTime | None, decodes: Iterable[DecodeSlack],
                  *, decoders: int, most: int, demand: int, least: int = 1) -> int:
    """The token budget of this iteration (decode tokens included), at most ``most`` (the
    engine's maximum) and at least ``decoders + least``: one prompt token keeps a queue
    moving when every decode is tight. ``demand``: prompt tokens waiting to be scheduled.
    Without a predictor yet (``step`` None) every rule is ``fixed``."""
    if rule is BudgetRule.FIXED or step is None:
        return most
    per_step = max(0, most - decoders)
    window = Window.of(decodes, step(0))
    if window is None:
        return most
    if rule is BudgetRule.GREEDY:
        prefill = time_to_budget(step, window.now_s, per_step)
    else:
        prefill = sliding_prefill(step, window, per_step, max(0, demand))
    return max(1, min(most, decoders + max(prefill, least)))
