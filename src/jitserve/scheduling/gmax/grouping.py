"""GMAX's group filter (paper section 4.2, Algorithm 1 steps 1-2): which B requests run
in the next frame. It keeps the top ``k * B`` live requests with priority >= ``p`` x the
B-th best (the cutoff; ``mechanisms.cutoff``), sorts them by context length and takes
the size-B window with the largest priority sum (the length window;
``mechanisms.lengthWindow``). :class:`GroupFilter` is the one owner of the cutoff p
(fixed, or learned by :class:`~jitserve.scheduling.gmax.cutoff.CutoffTuner`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from jitserve.policy import CutoffMode, SLOPolicySpec
from jitserve.scheduling.frame import Frame
from jitserve.scheduling.gmax.cutoff import CutoffTuner

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


class GroupFilter:
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

    def resume(self) -> None:
        if self.tuner is not None:
            self.tuner.restart_epoch()

    def run(self, frame: Frame) -> None:
        """A frame began (the tuner counts its epochs in frames): choose its group."""
        if self.fixed is None and self.enabled:
            assert self.tuner is not None
            self.tuner.on_frame(frame.now_s)
        if frame.live is None:
            return
        live = frame.live
        cut = GroupCut(frame.view.max_running, self.cutoff if self.enabled else None,
                       self.candidate_factor, self.length_window)
        frame.chosen, self.threshold = choose_by_context(
            live.prompt + live.generated, frame.priority, cut
        )

    def admits(self, priority: float) -> bool:
        """Would an arrival with ``priority`` have made the current group's cut?"""
        return priority >= self.threshold


@dataclass(frozen=True, slots=True)
class GroupCut:
    """How the group is cut from the live requests: ``batch`` slots (B); ``cutoff`` p
    (None: no cutoff filter, every top ``candidate_factor * B`` candidate may join); the
    length window on or off."""

    batch: int
    cutoff: float | None
    candidate_factor: int
    length_window: bool = True


def choose_by_context(
    context: FloatArray, priority: FloatArray, cut: GroupCut
) -> tuple[BoolArray, float]:
    """(mask of the chosen group, the priority an arrival needs to join it), over live
    requests given by their ``context`` tokens (the length window's order) and priority."""
    batch, cutoff = cut.batch, cut.cutoff
    n = priority.size
    chosen = np.zeros(n, dtype=bool)
    if n <= batch:
        chosen[:] = True
        return chosen, -math.inf
    k = min(n, cut.candidate_factor * batch)
    top = np.argpartition(-priority, k - 1)[:k] if k < n else np.arange(n)
    bth = float(np.partition(priority[top], len(top) - batch)[len(top) - batch])
    threshold = bth * cutoff if cutoff is not None else -math.inf
    candidates = top[priority[top] >= threshold]
    if candidates.size <= batch:
        chosen[candidates] = True
        return chosen, threshold
    if not cut.length_window:
        best = candidates[np.argpartition(-priority[candidates], batch - 1)[:batch]]
        chosen[best] = True
        return chosen, max(threshold, bth)
    ordered = candidates[np.argsort(context[candidates], kind="stable")]
    sums = np.convolve(priority[ordered], np.ones(batch), mode="valid")
    best_start = int(np.argmax(sums))
    chosen[ordered[best_start : best_start + batch]] = True
    return chosen, threshold
