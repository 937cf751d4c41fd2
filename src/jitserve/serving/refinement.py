"""When a request's length bound and expected length are refreshed (owner: the lifecycle).

A request's bound (the most tokens it is planned to generate) and expected length are
the length estimator's, set when it arrives and refreshed while it runs: every
``every`` generated tokens, and when it reaches its bound. With an analyzer connected
(:data:`~jitserve.serving.interface.RemoteRefine`) the running requests due a refresh
are handed to it instead, and its answers come back later through
:meth:`BoundRefiner.refine`, computed at the token count they were asked for. The
:class:`~jitserve.serving.lifecycle.Lifecycle` holds one and calls it on arrival, at each
frame and when a copy is withdrawn. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from jitserve.requests import LiveRequest
from jitserve.scheduling.estimators import LengthEstimator
from jitserve.serving.interface import RemoteRefine


class BoundRefiner:
    """Refreshes the bounds of running requests, locally or through a remote estimator."""

    def __init__(self, estimator: LengthEstimator, every: int) -> None:
        self.estimator = estimator
        self.every = every
        """Generated tokens between two refreshes of a running request's bound."""
        self.remote: RemoteRefine | None = None
        """The analyzer's refresh, when one is connected (None: the local estimator's)."""
        # refined while waiting: the policy read its old bound when it queued it
        self._requeue: dict[LiveRequest, None] = {}

    def refine(self, r: LiveRequest, bound: int | None, at: int | None, waiting: bool) -> None:
        """New bound (the estimator's, or ``bound`` from a remote one, computed at ``at``
        tokens) and expected length of ``r`` (``waiting``: it is queued, to be requeued)."""
        generated = r.generated if at is None else at
        computed = self.estimator.bound(r.req, generated) if bound is None else bound
        r.bound = max(computed, r.generated + 1)
        r.expected = self.estimator.expected(r.req, generated)
        r.bound_refined_at = generated
        if waiting:  # a remote answer for a request preempted meanwhile
            self._requeue[r] = None

    def refresh_due(self, running: Iterable[LiveRequest]) -> None:
        """Refresh the running requests due one (``every`` tokens since the last, or at
        their bound): here, or by asking the remote estimator."""
        due = [r for r in running
               if r.generated - r.bound_refined_at >= self.every or r.generated >= r.bound]
        if not due:
            return
        if self.remote is not None:
            self.remote(due)
            return
        for r in due:
            self.refine(r, None, None, waiting=False)

    def requeue(self, waiting: Callable[[LiveRequest], bool]) -> list[LiveRequest]:
        """The requests refined while waiting that still wait, to queue again (once)."""
        again = [r for r in self._requeue if waiting(r)]
        self._requeue.clear()
        return again

    def forget(self, r: LiveRequest) -> None:
        self._requeue.pop(r, None)
