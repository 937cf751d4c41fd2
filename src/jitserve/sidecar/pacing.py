"""How long the sidecar's scheduling frame is (owner: sidecar).

A frame is ``frame_steps`` decode steps of vLLM. The sidecar cannot see vLLM's steps, so
it times them from the tokens it receives: per running request, the tokens received
since the last frame over the time they took, the median over requests (robust to vLLM
merging several steps into one event when its reader lags). The result feeds the
lifecycle's :class:`~jitserve.serving.speed.SpeedMeter`; the frame length is clamped to
``[min_frame_s, max_frame_s]``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from jitserve.requests import LiveRequest
from jitserve.serving.speed import SpeedMeter
from jitserve.sidecar.jobs import Job


class FramePacer:
    def __init__(self, speed: SpeedMeter, min_frame_s: float, max_frame_s: float) -> None:
        self.speed = speed
        self.min_frame_s = min_frame_s
        self.max_frame_s = max_frame_s

    def frame_s(self, frame_steps: int) -> float:
        frame = frame_steps * self.speed.decode_step_s
        return min(max(frame, self.min_frame_s), self.max_frame_s)

    def measure(self, running: Iterable[tuple[LiveRequest, Job | None]], batch: int) -> None:
        samples = []
        decoders = 0
        for r, job in running:
            decoders += 1
            if job is None or job.mark_s is None or job.last_token_s is None:
                continue
            tokens = r.generated - job.mark_tokens
            if tokens >= 2 and job.last_token_s > job.mark_s:
                samples.append((job.last_token_s - job.mark_s) / tokens)
                job.mark_s, job.mark_tokens = job.last_token_s, r.generated
        if samples:
            self.speed.decode_stretch(statistics.median(samples), 1, min(decoders, batch))
