"""When the sidecar's scheduling frames come: their length and the loop (owner: sidecar).

A frame is ``frame_steps`` decode steps of vLLM. The sidecar cannot see vLLM's steps, so
it times them from the tokens it receives: per running request, the tokens received
since the last frame over the time they took, the median over requests (robust to vLLM
merging several steps into one event when its reader lags). The result feeds the
lifecycle's :class:`~jitserve.serving.speed.SpeedMeter`; the frame length is clamped to
``[min_frame_s, max_frame_s]``.

:class:`FrameLoop` runs the dispatcher's turns: at every wake-up (an arrival, an ending,
a reload, the backend back; at the latest every ``5 * min_frame_s``), with a frame when
one is due.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import statistics
from collections.abc import Callable, Iterable

from jitserve.requests import LiveRequest
from jitserve.serving.speed import SpeedMeter
from jitserve.sidecar.jobs import Job

log = logging.getLogger("jitserve.sidecar")


class FrameClock:
    """How long the next frame is: ``frame_steps`` decode steps at the measured speed,
    clamped (the scheduler's :class:`~jitserve.scheduling.gmax.pacing.PrefillPacer` paces
    prompts; this only times frames)."""

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


class FrameLoop:
    """Calls ``step(now, frame_due)`` at every wake-up; a frame is due ``frame_s()``
    after the last one (re-read at every wake-up: it follows the measured step time)."""

    def __init__(self, frame_s: Callable[[], float], step: Callable[[float, bool], None],
                 clock: Callable[[], float], max_sleep_s: float) -> None:
        self.frame_s = frame_s
        self.step = step
        self.clock = clock
        self.max_sleep_s = max_sleep_s
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """Take a turn now (new work, or room for it)."""
        self._wake.set()

    async def run(self) -> None:
        last_frame = -math.inf
        while True:
            wait = last_frame + self.frame_s() - self.clock()
            if wait > 0:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel
                # that comes as the event is set (shutdown sets it), and the loop never ends
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(wait, self.max_sleep_s)):
                        await self._wake.wait()
            self._wake.clear()
            now = self.clock()
            due = now >= last_frame + self.frame_s()
            if due:
                last_frame = now
            try:
                self.step(now, due)
            except Exception:  # a policy bug must not stop the loop
                log.exception("scheduling frame failed")
