"""When a new latency request's first token will come, and how wrong that forecast has
been: the door's on-time check (owner: the lifecycle, which the simulator and the sidecar
both drive).

At overload, a queue ordered by urgency serves every request at the edge of its target:
the scheduler starts each one as late as its estimates allow, and live, where the
engine's speed and the queue ahead are noisy, about half of those land just past it
(issue 29: TTFT median 1,959 ms against 2,000 ms at 1.8x capacity). So a latency arrival
is judged at the door, before it takes a place in the queue:

- **forecast** ``F``: the slots that must free before it gets one (the requests ahead of
  it in the policy's order, plus those already inside the engine beyond its ``B``
  slots; with preemption on, only running latency streams and unpreemptible requests
  hold a slot against it: the policy preempts the rest when an urgent arrival pays)
  times the engine's measured time per freed slot (the mean time a request holds a slot
  over ``B``), plus its own prefill and one decode step at the measured speeds;
- **error**: at its first token, how much longer it took (arrival to first token) than
  ``F``, in seconds; the last :data:`WINDOW` residuals are kept;
- **door**: refused (429, ``would_start_late``) when ``F`` plus the ``quantile`` of those
  residuals passes its TTFT target: the margin is what the forecast has been off by, at
  the attainment the policy aims for, not a hand constant. Until :data:`MIN_SAMPLES`
  first tokens have been seen, the margin is 0 (the forecast as it is).

The residual, not the ratio: live (vLLM alone on a core, 1.5x-1.8x capacity) the ratio's
0.9 quantile was 1.5-2.7, set by arrivals forecast at a few tens of milliseconds (a free
slot) that took a few hundred (vLLM's own queue, a prefill under load); scaled onto the
forecasts near the target, it refused work that would have been on time (served TTFT p90
1.4 s against 2 s, the engine below capacity). What the forecast misses is mostly a
delay, not a rate.

The forecast is made for every latency arrival, refused or not, so its error is learned
from the same requests the door judges; a refused request's forecast is never checked
(selection, accepted: what is admitted is what must be on time). So the margin forgets:
only residuals observed in the last :data:`MEMORY_S` seconds count. Without that, a
margin learned in a burst refused every latency arrival after it, no first token came
to correct it, and the door stayed shut for good (measured live: after a run at 1.5x
capacity, every latency request of every later run, honest or not, was refused with a
429 while the engine had room; docs/benchmarks.md, "Fair by contract ... live"). Once
the residuals have aged out, arrivals are judged by the forecast as it is until
:data:`MIN_SAMPLES` new first tokens teach the margin again.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from jitserve.policy import SLOPolicySpec

WINDOW = 256
MIN_SAMPLES = 16
MEMORY_S = 60.0
"""Residuals older than this (seconds, the lifecycle's clock) no longer set the margin."""
SLOT_EWMA = 0.05
"""Weight of one finished request in the mean time a request holds a slot."""


@dataclass(frozen=True, slots=True)
class DoorView:
    """What the forecast needs to know of the engine when a request arrives."""

    ahead: int
    """Requests waiting ahead of it in the policy's order."""
    running: int
    """Requests inside the engine (its ``B`` slots and any queue beyond them) that hold
    their place against the arrival."""
    max_running: int
    prefill_s: float
    """Its own prefill at the measured speed, plus one decode step."""


class FirstTokenForecast:
    """Forecasts a latency arrival's time to first token and learns its error."""

    def __init__(self, quantile: float = 0.9) -> None:
        self.quantile = quantile
        """0: no door check (forecasts are still made and learned)."""
        self.others_yield = True
        """Running requests other than latency streams give way to an urgent arrival
        (the policy preempts): they are not counted as holding a slot."""
        self.slot_s = math.nan
        """Mean seconds a request holds an engine slot (its prefill at the measured speed,
        then first token to finish)."""
        self._residuals: collections.deque[tuple[float, float]] = collections.deque(
            maxlen=WINDOW)
        """(when observed, residual) of the latest first tokens."""
        self._margin: tuple[float, float] | None = None  # (quantile, margin) until a change
        self.last_forecast_s = math.nan
        self.refused = 0

    def configure(self, spec: SLOPolicySpec) -> None:
        """The policy's settings: the quantile, and whether the policy preempts."""
        self.quantile = spec.admission.on_time_quantile
        self.others_yield = spec.scheduler.preemption.enabled

    def held_slot(self, seconds: float) -> None:
        """A request finished after holding a slot for ``seconds``."""
        if seconds <= 0:
            return
        if math.isnan(self.slot_s):
            self.slot_s = seconds
        else:
            self.slot_s += SLOT_EWMA * (seconds - self.slot_s)

    def forecast_s(self, view: DoorView) -> float:
        """Seconds from now to the arrival's first token, before any margin."""
        slots_ahead = view.ahead + view.running - view.max_running + 1
        wait = 0.0
        if slots_ahead > 0 and not math.isnan(self.slot_s):
            wait = slots_ahead * self.slot_s / max(view.max_running, 1)
        self.last_forecast_s = wait + view.prefill_s
        return self.last_forecast_s

    def observed(self, forecast_s: float, took_s: float, now_s: float) -> None:
        """A forecast request's first token came ``took_s`` after its arrival, at
        ``now_s``."""
        if took_s >= 0:
            self._residuals.append((now_s, took_s - forecast_s))
            self._margin = None

    def _forget(self, now_s: float) -> None:
        residuals = self._residuals
        while residuals and residuals[0][0] < now_s - MEMORY_S:
            residuals.popleft()
            self._margin = None

    def margin_s(self, now_s: float | None = None) -> float:
        """Seconds added to forecasts at the door at ``now_s`` (None: as of the last time
        one was given, to :meth:`late` or here): the ``quantile`` of the residuals of the
        last :data:`MEMORY_S` seconds (negative where forecasts have run long)."""
        if now_s is not None:
            self._forget(now_s)
        if len(self._residuals) < MIN_SAMPLES or self.quantile <= 0:
            return 0.0
        # computed once per change of the residuals, not per arrival: a burst of arrivals
        # between two first tokens (an engine step's worth) asks the same question
        if self._margin is None or self._margin[0] != self.quantile:
            margin = float(np.quantile(self._values(), self.quantile))
            self._margin = (self.quantile, margin)
        return self._margin[1]

    def late(self, forecast_s: float, ttft_s: float, now_s: float) -> bool:
        """Would a request forecast at ``now_s`` to take ``forecast_s`` miss a ``ttft_s``
        target?"""
        if self.quantile <= 0:
            return False
        if forecast_s + self.margin_s(now_s) <= ttft_s:
            return False
        self.refused += 1
        return True

    def _values(self) -> npt.NDArray[np.float64]:
        return np.fromiter((residual for _, residual in self._residuals), float,
                           count=len(self._residuals))

    def describe(self) -> dict[str, float]:
        residuals = self._values()
        return {
            "quantile": self.quantile,
            "margin_s": self.margin_s(),
            "samples": float(residuals.size),
            "residual_p50_s": float(np.median(residuals)) if residuals.size else math.nan,
            "slot_s": self.slot_s,
            "refused": float(self.refused),
        }
