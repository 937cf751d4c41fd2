"""GMAX's group: which B requests run in the next frame, and in which order the waiting
ones start (paper section 4.2, Algorithm 1 step 1-2, and seed 003 on overload).

- :class:`GroupFilter`: the stage, and the one owner of the cutoff p (fixed, or learned
  by its :class:`~jitserve.scheduling.gmax.cutoff.CutoffTuner`) and of the threshold an
  arrival must clear to join the group between frames;
- :func:`choose_by_context`: keep the top ``k * B`` requests with priority >= ``p`` x the
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

from jitserve.policy import CutoffMode, SLOPolicySpec
from jitserve.scheduling.frame import Frame
from jitserve.scheduling.gmax.cutoff import CutoffTuner

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
VALUE_BUCKETS = 8
"""Values within a factor e^(1/8) (~13%) count as equal when choosing whom to displace;
among equals the member with more work goes (more requests then meet their SLO)."""


class GroupFilter:
    """Chooses the group at each frame and keeps what an arrival must clear to join it."""

    name = "group"

    def __init__(self, seed: int = 0) -> None:
        self._seed = seed
        self.tuner: CutoffTuner | None = None
        self.fixed: float | None = None
        """The configured p when not tuned online; None: the tuner's."""
        self.enabled = True
        self.length_window = True
        self.candidate_factor = 4
        self.threshold = -math.inf
        """Priority an arrival needs to join the current group (p x the B-th best)."""

    def configure(self, spec: SLOPolicySpec) -> None:
        """New settings; what the tuner learned is kept."""
        s = spec.scheduler
        c = s.cutoff
        if self.tuner is None:
            self.tuner = CutoffTuner(c.candidates, c.value, c.epoch_frames, self._seed)
        else:
            self.tuner.reconfigure(c.candidates, c.value, c.epoch_frames)
        self.fixed = None if c.mode is CutoffMode.AUTO else c.value
        self.enabled = s.mechanisms.cutoff
        self.length_window = s.mechanisms.length_window
        self.candidate_factor = s.candidate_factor

    @property
    def cutoff(self) -> float:
        """The effective p."""
        assert self.tuner is not None
        return self.tuner.value if self.fixed is None else self.fixed

    def earned(self, tokens: float) -> None:
        assert self.tuner is not None
        self.tuner.earned(tokens)

    def run(self, frame: Frame) -> None:
        """A frame began (the tuner counts its epochs in frames): choose its group."""
        if self.fixed is None and self.enabled:
            assert self.tuner is not None
            self.tuner.on_frame(frame.now_s)
        if frame.live is None:
            return
        live = frame.live
        frame.chosen, self.threshold = choose_by_context(
            live.prompt + live.generated, frame.priority, frame.view.max_running,
            self.cutoff if self.enabled else None, self.candidate_factor, self.length_window,
        )  # fmt: skip

    def admits(self, priority: float) -> bool:
        """Would an arrival with ``priority`` have made the current group's cut?"""
        return priority >= self.threshold


def choose_by_context(
    context: FloatArray,
    priority: FloatArray,
    batch: int,
    cutoff: float | None,
    candidate_factor: int,
    length_window: bool = True,
) -> tuple[BoolArray, float]:
    """(mask of the chosen group, the priority an arrival needs to join it), over live
    requests given by their ``context`` tokens (the length window's order) and priority.

    ``cutoff`` None: no cutoff filter (every top ``k * B`` candidate may join)."""
    n = priority.size
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
    ordered = candidates[np.argsort(context[candidates], kind="stable")]
    sums = np.convolve(priority[ordered], np.ones(batch), mode="valid")
    best_start = int(np.argmax(sums))
    chosen[ordered[best_start : best_start + batch]] = True
    return chosen, threshold


def admit_feasible(
    prefill_left: FloatArray,
    n_running: int,
    value: FloatArray,
    start_key: FloatArray,
    latest_start: FloatArray,
    work_s: FloatArray,
    due_s: FloatArray,
    chosen: BoolArray,
    now_s: float,
    prefill_s: float,
    decode_s: float,
    token_s: float,
) -> float:
    """Drop from ``chosen`` the waiting members that cannot meet their SLO in the start
    order ``start_key`` (seed 003: urgency must not cascade; overload is detected, then
    the scheduler turns value-based).

    Walking the waiting members in start order, member k is feasible when (1) the
    prompts queued ahead of it (running prefills first) are done by its latest start,
    and (2) the engine time of everything ahead of it plus its own is done by its due
    time (running requests count what they can decode by then, one token per step).
    When k is not, accepted members ahead of it with less value per unit of engine time
    (then: more work) are displaced while that makes k feasible (weighted
    Moore-Hodgson); otherwise k leaves the group. O(N log N).

    Returns the highest value among the displaced members (-inf if none): under overload,
    an arrival worth no more than that would be displaced too."""
    running_work = np.sort(work_s[:n_running])
    running_prefix = np.concatenate([[0.0], np.cumsum(running_work)])
    # a running request decodes one token per step: by time h it takes at most
    # h / decode_s tokens of engine time, i.e. rate x h seconds of it
    rate = token_s / max(decode_s, 1e-9)

    def running_by(h: float) -> float:
        if not math.isfinite(h):
            return float(running_prefix[-1])
        cap = rate * max(h, 0.0)
        i = int(np.searchsorted(running_work, cap))
        return float(running_prefix[i] + cap * (n_running - i))

    def rank(j: int) -> tuple[float, float]:
        return (math.floor(math.log(max(float(value[j]), 1e-30)) * VALUE_BUCKETS), -work_s[j])

    def size(j: int) -> float:
        return float(prefill_left[j]) * prefill_s

    # The members up to the first one that is late need no displacement: walk them in
    # arrays (the same sums in the same order as the loop below), the rest one by one.
    order = np.flatnonzero(chosen[n_running:]) + n_running
    order = order[np.argsort(start_key[order], kind="stable")]
    sizes = prefill_left[order] * prefill_s
    works = work_s[order]
    backlog0 = float(prefill_left[:n_running].sum()) * prefill_s
    backlog_at = np.cumsum(np.concatenate([[backlog0], sizes]))
    queued_at = np.cumsum(np.concatenate([[0.0], works]))
    due = due_s[order]
    horizon = due - now_s
    cap = rate * np.maximum(horizon, 0.0)
    at = np.searchsorted(running_work, cap)
    with np.errstate(invalid="ignore"):
        by = np.where(
            np.isfinite(horizon), running_prefix[at] + cap * (n_running - at), running_prefix[-1]
        )
    late = (now_s + backlog_at[:-1] - latest_start[order] > 0) | (
        now_s + by + queued_at[:-1] + works - due > 0
    )
    bad = np.flatnonzero(late)
    if bad.size == 0:
        return -math.inf
    k = int(bad[0])
    ahead = order[:k].tolist()
    accepted: list[tuple[float, float, int]] = [(*rank(j), j) for j in ahead]
    heapq.heapify(accepted)  # min-heap: least value, then most work
    backlog = float(backlog_at[k])
    queued_work = float(queued_at[k])
    frontier = -math.inf
    members = order[k:].tolist()

    for i in members:
        late_start = now_s + backlog - latest_start[i]
        late_finish = (
            now_s + running_by(due_s[i] - now_s) + queued_work + work_s[i] - due_s[i]
        )
        evicted: list[tuple[float, float, int]] = []
        mine = rank(i)
        while (late_start > 0 or late_finish > 0) and accepted and accepted[0][:2] < mine:
            entry = heapq.heappop(accepted)
            j = entry[2]
            evicted.append(entry)
            late_start -= size(j)
            backlog -= size(j)
            late_finish -= work_s[j]
            queued_work -= work_s[j]
        if late_start > 0 or late_finish > 0:  # cannot be made feasible: undo, drop i
            for entry in evicted:
                heapq.heappush(accepted, entry)
                backlog += size(entry[2])
                queued_work += work_s[entry[2]]
            chosen[i] = False
            continue
        for entry in evicted:
            chosen[entry[2]] = False
            frontier = max(frontier, float(value[entry[2]]))
        heapq.heappush(accepted, (*mine, i))
        backlog += size(i)
        queued_work += work_s[i]
    return frontier

