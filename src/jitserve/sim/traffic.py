"""Traffic whose rate moves: a compressed day and bursts, for the autoscaling bench.

A workload is drawn at its mean rate (:mod:`jitserve.sim.workload`: the trace's own
arrival pattern, rescaled) and its arrival times are then warped so the rate follows a
:class:`RateShape` — the warp maps operational time ``u`` to ``t = Λ⁻¹(u)`` with
``Λ(t) = ∫₀ᵗ shape(s) / mean(shape) ds``, so the same items arrive, in the same order,
denser where the shape is high. Shapes are relative to the peak (1.0 at the peak):

- ``day``: one day compressed into the run: ``0.2 + 0.8 (1 - cos 2πt/D) / 2``, from a
  night trough at a fifth of the peak up to the afternoon peak and back (mean 0.6).
- ``bursts``: a base at 40% of the peak with three bursts to the peak (at 20%, 50% and
  80% of the run), each 3 minutes long with 30 s ramps (mean ~0.51 over an hour).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from jitserve.requests import Workitem

SHAPES = ("day", "bursts")
DAY_TROUGH = 0.2
BURST_BASE = 0.4
BURST_AT = (0.2, 0.5, 0.8)
BURST_S = 180.0
BURST_RAMP_S = 30.0
_GRID = 20001


@dataclass(frozen=True)
class RateShape:
    name: str
    duration_s: float

    def __post_init__(self) -> None:
        if self.name not in SHAPES:
            raise ValueError(f"unknown traffic shape {self.name!r}; known: {', '.join(SHAPES)}")
        if not self.duration_s > 0:
            raise ValueError(f"duration must be positive, got {self.duration_s}")

    def relative(self, t: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """The rate at ``t`` over the peak rate."""
        d = self.duration_s
        if self.name == "day":
            return DAY_TROUGH + (1 - DAY_TROUGH) * (1 - np.cos(2 * math.pi * t / d)) / 2
        rate = np.full_like(t, BURST_BASE)
        for at in BURST_AT:
            start = at * d
            rise = np.clip((t - start) / BURST_RAMP_S, 0, 1)
            fall = np.clip((start + BURST_S - t) / BURST_RAMP_S, 0, 1)
            rate = np.maximum(rate, BURST_BASE + (1 - BURST_BASE) * np.minimum(rise, fall))
        return rate

    def relative_at(self, t: float) -> float:
        return float(self.relative(np.array([t]))[0])

    def _grid(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        t = np.linspace(0.0, self.duration_s, _GRID)
        r = self.relative(t)
        cumulative = np.concatenate(([0.0], np.cumsum((r[1:] + r[:-1]) / 2 * np.diff(t))))
        return t, cumulative

    @property
    def mean(self) -> float:
        """The mean rate over the run, relative to the peak."""
        _, cumulative = self._grid()
        return float(cumulative[-1] / self.duration_s)

    def warp(self, items: Iterable[Workitem]) -> Iterator[Workitem]:
        """``items`` (drawn at the mean rate over ``duration_s``) with arrivals moved
        so the rate follows the shape."""
        t, cumulative = self._grid()
        operational = cumulative / cumulative[-1] * self.duration_s
        for item in items:
            at = float(np.interp(item.arrival_s, operational, t))
            yield replace(item, arrival_s=at)
