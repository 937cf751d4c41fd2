"""The request lifecycle's interface with the engines that drive it (owner: serving).

What an engine gives a :class:`~jitserve.serving.lifecycle.Lifecycle` (its
:class:`Executor`; a fleet's :class:`Copies` for late binding; a :data:`RemoteRefine`
hook for an analyzer's bounds) and the plain data the lifecycle hands back (what a frame
did, who was retired and with what outcome, its counters), like vLLM v1's scheduler
interface and outputs. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from jitserve.goodput import LogHistogram, Outcome
from jitserve.requests import LiveRequest
from jitserve.scheduling.base import RetireReason

RemoteRefine = Callable[[list[LiveRequest]], None]
"""Asks a remote estimator (the analyzer) for new bounds of the given running requests;
the answer comes back through :meth:`~jitserve.serving.lifecycle.Lifecycle.refine`."""


class Executor(Protocol):
    """What the lifecycle needs of the engine that runs the requests."""

    def sync(self, now_s: float) -> None:
        """Bring every running request's ``generated`` up to ``now_s``."""

    def stop(self, r: LiveRequest) -> None:
        """Stop running ``r`` now, delivering (via
        :meth:`~jitserve.serving.lifecycle.Lifecycle.delivered`) the tokens it produced so
        far; ``r`` is still RUNNING during the call."""


class TrafficObserver(Protocol):
    """Sees the traffic a lifecycle serves, as it happens: what arrived and what finished
    (the tuner's record of the past, :mod:`jitserve.serving.traffic`)."""

    def arrived(self, r: LiveRequest, now_s: float) -> None: ...

    def finished(self, r: LiveRequest, now_s: float) -> None: ...


class Copies(Protocol):
    """Late binding (the simulator's ``power-of-k-late``, the paper's power-of-K): one
    request waits as a copy in several replicas' lifecycles; the first to start it keeps
    it. Without one (the sidecar, one replica) nothing here changes."""

    def started(self, r: LiveRequest, now_s: float) -> None:
        """``r`` started on this replica: withdraw its other copies
        (:meth:`~jitserve.serving.lifecycle.Lifecycle.withdraw` on theirs). Called at every
        start; a request already bound is a no-op."""

    def leaving(self, r: LiveRequest) -> bool:
        """``r``, waiting here, is about to leave unstarted (retired): True if another copy
        of it still waits elsewhere, so this one is withdrawn without an outcome."""


@dataclass(frozen=True, slots=True)
class Retired:
    request: LiveRequest
    reason: RetireReason
    outcome: Outcome | None
    """The request's outcome, or its program's (given once, with the first member)."""


@dataclass(slots=True)
class FrameResult:
    preempted: list[LiveRequest] = field(default_factory=list)
    retired: list[Retired] = field(default_factory=list)
    policy_s: float = 0.0


@dataclass(slots=True)
class LifecycleStats:
    preemptions: int = 0
    retired: int = 0
    frames: int = 0
    frame_seconds: LogHistogram = field(default_factory=LogHistogram)
