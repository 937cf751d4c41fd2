"""SlidingServe's BatchConstructor (arXiv 2606.05933, §4.3): a prefill subset instead of
the full candidate batch when that batch would make a prefill miss its first token (pure).

The full batch's predicted time ``T_full`` is checked against each prefill's TTFT slack.
If some prefill that can still make it (slack >= 0) has less slack than ``T_full``, each
such *anchor* ``a`` bounds the batch by its slack: TimeToBudget gives the prompt capacity
``C_a`` within it; an anchor whose own remaining prefill exceeds ``C_a`` is infeasible;
otherwise the anchor is taken and a 0/1 knapsack fills ``C_a - r_a`` with the candidates
whose slack is no earlier than the anchor's (weight: remaining prefill; value: prefers
small slack and few tokens). The anchors' solutions are compared by prefills completed,
then value, then tokens used; the winner runs each chosen prefill to completion.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from jitserve.scheduling.budget import StepTime, time_to_budget

GRAIN = 16
"""Knapsack weights in units of this many tokens (a KV block): small DP tables."""


@dataclass(frozen=True, slots=True)
class Candidate:
    """A prefill in the candidate batch: prompt tokens left and TTFT slack (s)."""

    remaining: int
    slack_s: float


def value(c: Candidate) -> float:
    return 1.0 / ((max(c.slack_s, 0.0) + 0.01) * max(c.remaining, 1))


def _knapsack(items: Sequence[int], cands: Sequence[Candidate],
              capacity: int) -> list[int]:
    """The subset of ``items`` within ``capacity`` tokens maximising (count, value, used)."""
    units = capacity // GRAIN
    weights = [math.ceil(cands[i].remaining / GRAIN) for i in items]
    best: list[tuple[int, float, int]] = [(0, 0.0, 0)] * (units + 1)
    keep = [[False] * (units + 1) for _ in items]
    for k, i in enumerate(items):
        w, v, r = weights[k], value(cands[i]), cands[i].remaining
        for cap in range(units, w - 1, -1):
            prev = best[cap - w]
            option = (prev[0] + 1, prev[1] + v, prev[2] + r)
            if option > best[cap]:
                best[cap] = option
                keep[k][cap] = True
    chosen, cap = [], units
    for k in range(len(items) - 1, -1, -1):
        if keep[k][cap]:
            chosen.append(items[k])
            cap -= weights[k]
    return chosen


def construct(step: StepTime, cands: Sequence[Candidate], per_step: int,
              full_tokens: int) -> list[int] | None:
    """Indices of the prefills to run to completion this iteration, or None to keep the
    full candidate batch (no prefill at risk, or no anchor feasible)."""
    t_full = step(full_tokens)
    risky = [i for i, c in enumerate(cands) if 0 <= c.slack_s < t_full]
    best: tuple[tuple[int, float, int], list[int]] | None = None
    for a in risky:
        anchor = cands[a]
        capacity = time_to_budget(step, anchor.slack_s, per_step)
        if anchor.remaining > capacity:
            continue
        others = [j for j, c in enumerate(cands) if j != a and c.slack_s >= anchor.slack_s]
        chosen = [a, *_knapsack(others, cands, capacity - anchor.remaining)]
        score = (len(chosen), sum(value(cands[i]) for i in chosen),
                 sum(cands[i].remaining for i in chosen))
        if best is None or score > best[0]:
            best = (score, chosen)
    return None if best is None else best[1]
