"""A stall bound for a task's per-token awaits, at O(1) a token (owner: sidecar).

``asyncio.timeout`` around every read of a vLLM stream and every write to a client
creates, reschedules and cancels a timer per token: about a fifth of the sidecar's CPU
per streamed token. :class:`StallWatch` keeps one timer per stream instead and re-arms it
lazily: :meth:`StallWatch.arm` before each await only notes the time; the timer, when it
fires, either finds progress (and re-arms itself at the last arm + the limit) or cancels
the task, which then sees :meth:`StallWatch.expired` and raises its own error.
"""

from __future__ import annotations

import asyncio


class StallWatch:
    """Cancels the task that made it when an await it :meth:`arm`-ed for has lasted
    ``limit_s``. ``limit_s`` None: never."""

    def __init__(self, limit_s: float | None) -> None:
        self.limit_s = limit_s
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._last = 0.0
        self._armed = False
        self._handle: asyncio.TimerHandle | None = None
        self._fired = False

    def arm(self) -> None:
        """The await about to start may last at most ``limit_s``."""
        self._last = self._loop.time()
        self._armed = True
        if self._handle is None and self.limit_s is not None:
            self._handle = self._loop.call_at(self._last + self.limit_s, self._check)

    def disarm(self) -> None:
        """No bound until the next :meth:`arm` (the timer, if pending, finds it idle)."""
        self._armed = False

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._armed = False

    def expired(self) -> bool:
        """Whether a CancelledError the task just got is this watch's doing; if so it is
        taken back (``uncancel``), so the task may raise its own error instead."""
        if not self._fired:
            return False
        self._fired = False
        return self._task is None or self._task.uncancel() == 0

    def _check(self) -> None:
        self._handle = None
        if not self._armed or self.limit_s is None:
            return
        due = self._last + self.limit_s
        if self._loop.time() < due:
            self._handle = self._loop.call_at(due, self._check)
            return
        self._armed = False
        self._fired = True
        if self._task is not None:
            self._task.cancel()
