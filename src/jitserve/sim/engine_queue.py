"""The sidecar stack's queue inside vLLM, as the simulator models it (pure).

Live, the sidecar dispatches in its policy's order up to ``engine_queue`` requests
beyond vLLM's B slots (:mod:`jitserve.sidecar.dispatcher`); vLLM then takes them into
its batch in dispatch order (``--scheduling-policy priority`` with priority = the
dispatch sequence), whatever arrives after them. A request dispatched is running for the
policy (it counts against B + engine queue and can be preempted back), but its place in
line is fixed. With ``engine_queue`` 0 (the default) the simulator's engine asks the
policy at the very step a slot frees, as an in-engine scheduler would.

``unstarted`` (the profile's ``engine_queue_unstarted``) models a rule the sidecar does
not have yet: the queue bounds the dispatched requests that have no token yet (waiting
in vLLM or in their prefill), not those dispatched beyond B. Under overload GMAX keeps
vLLM below its B slots, so the sidecar's rule fills every free slot as well and vLLM's
queue drains by the step budget in dispatch order (docs/benchmarks.md).
"""

from __future__ import annotations

from collections import deque

from jitserve.requests import LiveRequest
from jitserve.serving.lifecycle import Lifecycle


class EngineQueue:
    """Requests the policy has started that wait, in dispatch order, for an engine slot."""

    def __init__(self, size: int, unstarted: bool = False) -> None:
        assert size > 0, "an engine queue of 0 is the engine asking the policy directly"
        self.size = size
        self.unstarted = unstarted
        self._line: deque[LiveRequest] = deque()

    def __contains__(self, r: LiveRequest) -> bool:
        return r in self._line

    def room(self, lifecycle: Lifecycle, max_running: int, prefilling: int) -> bool:
        """Whether an arrival would be dispatched now: fewer than B + the queue are
        started (and, ``unstarted``, fewer than the queue lack a token: waiting here or
        among the engine's ``prefilling``)."""
        return len(lifecycle.running) < max_running + self.size and (
            not self.unstarted or len(self._line) + prefilling < self.size)

    def top_up(self, lifecycle: Lifecycle, now_s: float, max_running: int,
               prefilling: int) -> None:
        """Dispatch in the policy's order while there is :meth:`room`."""
        while self.room(lifecycle, max_running, prefilling):
            r = lifecycle.start_next(now_s)
            if r is None:
                return
            self._line.append(r)

    def head(self) -> LiveRequest | None:
        return self._line[0] if self._line else None

    def take(self) -> LiveRequest:
        """The head enters the engine's batch."""
        return self._line.popleft()

    def remove(self, r: LiveRequest) -> None:
        """``r`` was stopped before it reached a slot (preempted back to the policy)."""
        self._line.remove(r)
