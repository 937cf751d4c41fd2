"""Whether a new request may enter the sidecar now, and when to come back (owner: sidecar).

The checks a new request passes before it is queued:

- 503 while the sidecar drains (``shutting_down``) or vLLM is down (``backend_down``,
  with the health check's reason): :meth:`Admission.check_open`, asked before tokenizing;
- 429 when a new compound program would pass ``limits.maxPrograms``
  (``too_many_programs``): :meth:`Admission.check_program_room`;
- 429 when ``admission.queueCap`` requests wait (``queue_full``; the replica report's
  ``shedding`` is the same condition, :meth:`Admission.queue_full`):
  :meth:`Admission.check`, which asks :meth:`~Admission.check_open` again, at submit.

Refusals for draining, a backend down and a full queue are counted by reason in
``jitserve_rejections_total``. A refusal that waiting can fix carries ``Retry-After``
(:meth:`Admission.retry_after_s`): the waiting requests over the batch times the mean
service time of the finished ones (:meth:`Admission.served`), 1 to 60 s; a request
retired by overload control gets it too. The dispatcher sets :attr:`Admission.draining`
when it drains; the queue is the lifecycle's, only read here.
"""

from __future__ import annotations

import math

from jitserve.policy import SLOPolicySpec
from jitserve.serving.lifecycle import Lifecycle
from jitserve.sidecar.api import ProgramRef
from jitserve.sidecar.errors import APIError, backend_down, queue_full, shutting_down
from jitserve.sidecar.health import BackendHealth
from jitserve.sidecar.metrics import SidecarMetrics
from jitserve.sidecar.programs import ProgramBook


class Admission:
    """The admission checks over one lifecycle's queue, one backend's health and one
    program book; ``configure`` with each new policy file."""

    def __init__(self, lifecycle: Lifecycle, health: BackendHealth, programs: ProgramBook,
                 metrics: SidecarMetrics, spec: SLOPolicySpec, max_running: int) -> None:
        self.lifecycle = lifecycle
        self.health = health
        self.programs = programs
        self.metrics = metrics
        self.max_running = max_running
        self.queue_cap = spec.admission.queue_cap
        self.max_programs = spec.limits.max_programs
        self.draining = False
        """Set once the sidecar drains: every new request is refused (503)."""
        self.service_s = 2.0
        """Mean time a request runs once started (moving average)."""

    def configure(self, spec: SLOPolicySpec) -> None:
        self.queue_cap = spec.admission.queue_cap
        self.max_programs = spec.limits.max_programs

    def served(self, service_s: float) -> None:
        """A request ran ``service_s`` from its start to its end."""
        self.service_s += 0.1 * (service_s - self.service_s)

    def retry_after_s(self) -> int:
        backlog = self.lifecycle.policy.waiting() / max(self.max_running, 1) * self.service_s
        return int(min(max(math.ceil(backlog), 1), 60))

    def queue_full(self) -> bool:
        return self.lifecycle.policy.waiting() >= self.queue_cap

    def check_open(self) -> None:
        """Raise the APIError a new request gets while the sidecar drains or vLLM is down
        (the server asks before tokenizing, :meth:`check` again at submit)."""
        if self.draining:
            self.metrics.rejections.labels("draining").inc()
            raise shutting_down()
        if not self.health.ready:
            self.metrics.rejections.labels("backend_down").inc()
            raise backend_down(self.retry_after_s(),
                               f"the model backend is unavailable: {self.health.reason}")

    def check(self) -> None:
        """Raise the APIError a new request gets now (draining, backend down, queue full)."""
        self.check_open()
        if self.queue_full():
            self.metrics.rejections.labels("queue_full").inc()
            raise queue_full(self.retry_after_s(),
                             f"the request queue is full ({self.queue_cap} waiting)")

    def check_program_room(self, program: ProgramRef | None, tenant: str) -> None:
        """Raise a 429 when ``program`` is new and ``limits.maxPrograms`` are in flight."""
        if program is None:
            return
        live, cap = self.programs.programs, self.max_programs
        if (tenant, program.program_id) not in live and len(live) >= cap:
            raise APIError(429, f"too many compound programs in flight ({cap}, "
                           "limits.maxPrograms of the policy)", type_="rate_limit_error",
                           param="slo.program_id", code="too_many_programs",
                           retry_after_s=self.retry_after_s())
