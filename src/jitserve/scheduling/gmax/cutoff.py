"""GMAX's cutoff ``p``, learned online (paper section 4.2: "automates and continuously
adapts p online by exploring different thresholds"). It survives a hot reload: what it
learned about candidates still offered is kept."""

from __future__ import annotations

import random

MIN_EPOCH_S = 1e-3


class CutoffTuner:
    """Online choice of the cutoff p: epsilon-greedy over candidate values, rewarding
    the goodput (tokens/s) that completed during each epoch of frames."""

    def __init__(
        self, candidates: list[float], start: float, epoch_frames: int, seed: int = 0
    ) -> None:
        self.candidates = sorted(set(candidates) | {start})
        self.value = start
        self.epoch_frames = epoch_frames
        self._reward: dict[float, float] = {}
        self._frames = 0
        self._earned = 0.0
        self._epoch_start_s: float | None = None
        self._epochs = 0
        self._rng = random.Random(seed)

    def reconfigure(self, candidates: list[float], start: float, epoch_frames: int) -> None:
        """New settings on hot reload: what was learned about candidates still offered is
        kept, and so is the current value if it is still a candidate."""
        self.candidates = sorted(set(candidates) | {start})
        self._reward = {c: r for c, r in self._reward.items() if c in self.candidates}
        if self.value not in self.candidates:
            self.value = start
        self.epoch_frames = epoch_frames

    def restart_epoch(self) -> None:
        """The epoch under way is dropped, not scored (its frames were not all the
        cutoff's: another scheduler ran in between)."""
        self._frames, self._earned, self._epoch_start_s = 0, 0.0, None

    def earned(self, tokens: float) -> None:
        self._earned += tokens

    def on_frame(self, now_s: float) -> None:
        if self._epoch_start_s is None:
            self._epoch_start_s = now_s
        self._frames += 1
        if self._frames < self.epoch_frames:
            return
        elapsed = max(now_s - self._epoch_start_s, MIN_EPOCH_S)
        rate = self._earned / elapsed
        old = self._reward.get(self.value)
        self._reward[self.value] = rate if old is None else 0.5 * old + 0.5 * rate
        self._epochs += 1
        self._frames, self._earned, self._epoch_start_s = 0, 0.0, now_s
        untried = [c for c in self.candidates if c not in self._reward]
        epsilon = max(0.05, 1.0 / (1 + self._epochs / 4))
        if untried:
            self.value = untried[0]
        elif self._rng.random() < epsilon:
            self.value = self._rng.choice(self.candidates)
        else:
            self.value = max(self._reward, key=lambda c: self._reward[c])
