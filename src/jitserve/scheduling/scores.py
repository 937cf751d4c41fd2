"""What a scorer computes from and into: the engine's measured speeds (one engine, or one
per row when a request is scored on several replicas) and the per-request scores a
frame's later stages read (:class:`~jitserve.scheduling.frame.Frame`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


@dataclass(slots=True)
class Speeds:
    """The engine's measured speeds at the current load."""

    decode_s: float = 0.03
    """One decode step (v_token)."""
    prefill_s: float = 1e-4
    """Wall time per queued prompt token."""
    token_s: float = 1e-4
    """Engine time per batched token (the marginal cost of one more token)."""
    batch: int = 256
    slots_bind: bool = False
    """More live requests than batch slots at the last frame."""
    z_q: float = 1.645
    """Standard normal quantile of the length bound's level q."""

    def decode_only_s(self, running: int) -> float:
        """The fastest step ``running`` requests can have: decoding alone, no prompt
        chunk (a per-token need below it is one prefill pacing cannot meet)."""
        return self.token_s * running


@dataclass(slots=True)
class RowSpeeds:
    """Speeds and clock per row: one request scored on several engines in one call
    (placement's replica-specific priority, :mod:`jitserve.placement.power_of_k`)."""

    now_s: FloatArray
    decode_s: FloatArray
    prefill_s: FloatArray
    token_s: FloatArray
    batch: FloatArray
    slots_bind: npt.NDArray[np.bool_]


@dataclass(slots=True)
class Scores:
    priority: FloatArray
    """Goodput per unit of engine time, aged."""
    latest_start: FloatArray
    """Latest start (s) that still earns the full gain; the group's sequencing key."""
    median: float
    """Median positive priority before aging (the scale of aging and fairness)."""
    work_s: FloatArray
    """Engine time the rest of the request takes at the measured per-token cost."""
    due_s: FloatArray
    """When its last token is due (deadline, stage sub-deadline, or latency timeline)."""
    gain: FloatArray
    """Expected goodput if started now (0: nothing left to earn)."""
    need_s: FloatArray
    """Per-token time r needs from now on: its TBT (latency) or time left over typical
    tokens left (others); infinite when demoted."""
