"""Prefill pacing: GMAX starts new prompts no faster than the running requests' SLOs
allow (the paper's per-request bandwidth, applied to the engine's iteration time).

With chunked prefill and a large token budget, an engine with a queue fills every
iteration with prompt chunks, so one decode step takes as long as the budget's worth of
prefill (~150 ms for 2,048 tokens of an 8B model on an A100): longer than a 100 ms TBT,
and too slow for a 20 s deadline with a few hundred tokens to go. Every running request
that can still earn goodput needs one token per ``tau`` seconds (latency: its TBT;
deadline and compound: time left over tokens left); the pacer keeps the measured step
time under the tightest such need that pacing can still meet, by admitting prompt tokens
at a rate it adapts at every frame (additive increase while steps are fast enough,
multiplicative decrease when they are not). With nothing to protect it does not pace.
Pacing never blocks the queue: when the head's prompt does not fit the tokens the pacer
allows now, the next request in queue order whose prompt fits starts instead.

With fairness weight f the need protected moves from that low quantile to the tightest
(at f = 1): the fair order decides which tenant's requests start, and what started must
stay on pace, or the order is not the service the tenants get (issue 27: at load 1.5 and
2.0, f = 1 closed 30-62% of the tenants' gaps to their max-min shares with the order
alone, 66-75% with the started requests protected; docs/scheduling.md).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from jitserve.policy import SLOPolicySpec
from jitserve.scheduling.frame import Frame
from jitserve.scheduling.gmax.scoring import FairShare

DECREASE = 0.5
INCREASE = 1.5
TAU_QUANTILE = 0.1
"""The need protected (f = 0): a low quantile of the running requests' per-token needs,
so one outlier does not stop admissions; ``(1 - f)`` times it with fairness weight f."""


def protected_need(needs: npt.NDArray[np.float64], f: float) -> float:
    """The per-token need GMAX protects among ``needs`` (non-empty) with fairness weight
    ``f``: the ``(1 - f) x TAU_QUANTILE`` quantile, the tightest at f = 1. The pacer's and
    the fair yield's (:mod:`~jitserve.scheduling.gmax.yielding`)."""
    return float(np.quantile(needs, (1 - f) * TAU_QUANTILE))


class PrefillPacer:
    name = "pace"

    def __init__(self, fair: FairShare | None = None) -> None:
        self.fair = fair
        """The fairness weight's owner (None: f = 0)."""
        self.rate = math.inf
        """Prompt tokens per second that may start."""
        self.tau_s = math.inf
        self._bucket = 0.0
        self._last_s: float | None = None
        self._started_tokens = 0.0
        self._frame_start_s: float | None = None

    def configure(self, spec: SLOPolicySpec) -> None:
        pass

    def run(self, frame: Frame) -> None:
        """At a frame: adapt the rate to the running requests that can still earn."""
        if frame.scores is None or frame.speeds is None:
            return
        first = frame.first_waiting
        needs = frame.scores.need_s[:first][frame.scores.gain[:first] > 0]
        # a need below the fastest step pacing can give (decoding alone) cannot be met by
        # pacing: it is not protected
        floor_s = frame.speeds.decode_only_s(first)
        self.on_frame(frame.now_s, needs[np.isfinite(needs) & (needs > floor_s)],
                      frame.view.decode_step_s)

    def on_frame(self, now_s: float, savable: npt.NDArray[np.float64], step_s: float) -> None:
        """``savable``: the per-token time each running request that pacing can still
        save needs; ``step_s``: the measured step time."""
        elapsed = now_s - self._frame_start_s if self._frame_start_s is not None else 0.0
        admitted_rate = self._started_tokens / elapsed if elapsed > 0 else math.inf
        self._frame_start_s, self._started_tokens = now_s, 0.0
        if savable.size == 0:
            self.rate, self.tau_s = math.inf, math.inf
            return
        f = self.fair.f if self.fair is not None else 0.0
        self.tau_s = protected_need(savable, f)
        if step_s > self.tau_s:
            base = self.rate if math.isfinite(self.rate) else admitted_rate
            self.rate = DECREASE * base if math.isfinite(base) else 0.0
        elif math.isfinite(self.rate):
            self.rate = INCREASE * self.rate + 1.0 / max(self.tau_s, 1e-3)
            if step_s < DECREASE * self.tau_s:
                self.rate = math.inf

    def resume(self) -> None:
        """Its clocks start again (the bucket did not fill while another scheduler ran);
        the rate it learned stays."""
        self._bucket, self._last_s = 0.0, None
        self._started_tokens, self._frame_start_s = 0.0, None

    def budget(self, now_s: float, head_tokens: int) -> float:
        """Prompt tokens that may start now (infinite when not pacing), the bucket topped
        up to a burst that always lets the queue head (``head_tokens``) through in time."""
        if not math.isfinite(self.rate):
            return math.inf
        if self._last_s is not None:
            burst = max(self.rate * self.tau_s * 10, float(head_tokens))
            self._bucket = min(self._bucket + self.rate * (now_s - self._last_s), burst)
        self._last_s = now_s
        return self._bucket

    def started(self, tokens: int) -> None:
        self._bucket -= tokens
        self._started_tokens += tokens
