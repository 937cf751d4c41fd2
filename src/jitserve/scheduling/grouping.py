"""GMAX's group: which B requests run in the next frame, and in which order the waiting
ones start (paper section 4.2, Algorithm 1 step 1-2, and seed 003 on overload).

- :func:`choose_group`: keep the top ``k * B`` requests with priority >= ``p`` x the
  B-th best (the cutoff), sort them by input length and take the size-B window with the
  largest priority sum (the length window). Either step can be switched off
  (``mechanisms.cutoff``, ``mechanisms.lengthWindow``).
- :func:`admit_feasible`: walk the waiting members in their start order, projecting when
  each would start given the prompts queued ahead of it; a member that would start too
  late displaces lower-priority members ahead of it if that makes it feasible, otherwise
  it leaves the group (weighted Moore-Hodgson, O(N log N)).
"""

from __future__ import annotations

import heapq
import math

import numpy as np
import numpy.typing as npt

from jitserve.requests import LiveRequest

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def choose_group(
    live: list[LiveRequest],
    priority: FloatArray,
    batch: int,
    cutoff: float | None,
    candidate_factor: int,
    length_window: bool = True,
) -> tuple[BoolArray, float]:
    """(mask over ``live`` of the chosen group, the priority an arrival needs to join it).

    ``cutoff`` None: no cutoff filter (every top ``k * B`` candidate may join)."""
    n = len(live)
    chosen = np.zeros(n, dtype=bool)
    if n <= batch:
        chosen[:] = True
        return chosen, -math.inf
    k = min(n, candidate_factor * batch)
    top = np.argpartition(-priority, k - 1)[:k] if k < n else np.arange(n)
    bth = float(np.partition(priority[top], len(top) - batch)[len(top) - batch])
    threshold = bth * cutoff if cutoff is not None else -math.inf
    candidates = top[priority[top] >= threshold]
    if candidates.size <= batch:
        chosen[candidates] = True
        return chosen, threshold
    if not length_window:
        best = candidates[np.argpartition(-priority[candidates], batch - 1)[:batch]]
        chosen[best] = True
        return chosen, max(threshold, bth)
    lengths = np.array([live[i].context_tokens for i in candidates])
    ordered = candidates[np.argsort(lengths, kind="stable")]
    sums = np.convolve(priority[ordered], np.ones(batch), mode="valid")
    best_start = int(np.argmax(sums))
    chosen[ordered[best_start : best_start + batch]] = True
    return chosen, threshold


def admit_feasible(
    live: list[LiveRequest],
    n_running: int,
    priority: FloatArray,
    start_key: FloatArray,
    latest_start: FloatArray,
    chosen: BoolArray,
    now_s: float,
    prefill_s: float,
) -> None:
    """Drop from ``chosen`` the waiting members that would start after their latest
    start (seed 003: urgency must not cascade), walking members in ``start_key`` order
    and displacing lower-priority members ahead when that makes one feasible."""
    backlog = sum(r.prefill_target - r.prefilled for r in live[:n_running]) * prefill_s
    members = [i for i in range(n_running, len(live)) if chosen[i]]
    members.sort(key=lambda i: start_key[i])
    accepted: list[tuple[float, int]] = []  # min-heap on priority

    def size(j: int) -> float:
        return (live[j].prefill_target - live[j].prefilled) * prefill_s

    for i in members:
        overflow = now_s + backlog - latest_start[i]
        evicted: list[tuple[float, int]] = []
        while overflow > 0 and accepted and accepted[0][0] < priority[i]:
            p_j, j = heapq.heappop(accepted)
            evicted.append((p_j, j))
            overflow -= size(j)
            backlog -= size(j)
        if overflow > 0:  # cannot be made feasible: undo the evictions, drop i
            for p_j, j in evicted:
                heapq.heappush(accepted, (p_j, j))
                backlog += size(j)
            chosen[i] = False
            continue
        for _, j in evicted:
            chosen[j] = False
        heapq.heappush(accepted, (float(priority[i]), i))
        backlog += size(i)
