"""The scheduler a pod runs now, and since when (owner: sidecar).

It is the policy file's ``scheduler.policy``, or with ``auto`` the tuner's choice
(:mod:`~jitserve.sidecar.tuning`). A change of scheduler is the lifecycle's switch: the
waiting requests move to the new policy in the order they came, the running ones run on,
none is dropped, duplicated or restarted; the same scheduler under new settings is
reconfigured and keeps what it learned (GMAX's cutoff, its pacer). The metrics say which
one runs and since when (``jitserve_policy_in_effect``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from jitserve.policy import SLOPolicySpec
from jitserve.scheduling.base import Policy
from jitserve.serving.lifecycle import Lifecycle
from jitserve.sidecar.metrics import SidecarMetrics

PolicyFactory = Callable[[SLOPolicySpec], Policy]
"""Builds the scheduler ``spec.scheduler.policy`` names (never ``auto``)."""


def default_policy_factory(spec: SLOPolicySpec) -> Policy:
    from jitserve.scheduling.registry import make_policy

    return make_policy(spec)


def running_spec(spec: SLOPolicySpec, name: str) -> SLOPolicySpec:
    """``spec`` as the scheduler ``name`` runs it (``scheduler.policy`` = ``name``)."""
    if spec.scheduler.policy == name:
        return spec
    return spec.with_scheduler(policy=name)


class InEffect:
    """Which scheduler runs, since when (wall clock, for the status), and the switch."""

    def __init__(self, factory: PolicyFactory, metrics: SidecarMetrics,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.factory = factory
        self.metrics = metrics
        self.wall_clock = wall_clock
        self.name = ""
        self.since_s = 0.0
        self.history: deque[tuple[float, str]] = deque(maxlen=32)
        """(Unix time, scheduler) of the last changes, the first the start."""

    def first(self, spec: SLOPolicySpec) -> Policy:
        """The policy to start with."""
        self._now_running(spec.scheduler.running())
        return self.factory(running_spec(spec, self.name))

    def apply(self, lifecycle: Lifecycle, spec: SLOPolicySpec, now_s: float,
              choice: str | None = None) -> bool:
        """Run what ``spec`` says, with ``auto`` ``choice`` (default: the scheduler in
        effect, when it is still a candidate); whether the scheduler changed."""
        name = spec.scheduler.running(choice or self.name)
        if name == self.name:
            lifecycle.policy.configure(running_spec(spec, name))
            return False
        running = running_spec(spec, name)
        lifecycle.switch_policy(lifecycle.resumable(name, running) or self.factory(running),
                                now_s)
        self._now_running(name)
        self.metrics.policy_switches.inc()
        return True

    def _now_running(self, name: str) -> None:
        self.name, self.since_s = name, self.wall_clock()
        self.history.append((self.since_s, name))
        self.metrics.in_effect(name, self.since_s)

    def as_dict(self) -> dict[str, Any]:
        """For ``/debug/scheduler``: since when, and the last changes."""
        return {"since": self.since_s,
                "history": [{"at": at, "scheduler": name} for at, name in self.history]}
