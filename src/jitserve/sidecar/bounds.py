"""Length bounds for the sidecar's requests (owner: sidecar).

With an analyzer configured, the first bound of a request, its refinements (one batched
call at a time, applied when it answers) and the finished lengths go to the analyzer's
QRF over gRPC; its client answers from a local fallback when the analyzer is slow or
down. Without one (or when a call fails), the lifecycle's local quantile estimator
answers. Either way the *expected* length comes from the local estimator.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Sequence
from typing import Any, Protocol

from jitserve.requests import LiveRequest, Phase, Request
from jitserve.serving.lifecycle import Lifecycle
from jitserve.sidecar.metrics import SidecarMetrics
from jitserve.sidecar.programs import StageShares

log = logging.getLogger("jitserve.sidecar")


class Analyzer(StageShares, Protocol):
    """What the sidecar needs of the analyzer's client
    (:class:`jitserve.analyzer.client.AsyncAnalyzerClient`)."""

    async def bounds(self, reqs: Sequence[Request], generated: Sequence[int] | None = None,
                     ) -> list[int]: ...

    async def observe(self, req: Request, output_tokens: int) -> None: ...


class AnalyzerBounds:
    def __init__(self, lifecycle: Lifecycle, metrics: SidecarMetrics) -> None:
        self.lifecycle = lifecycle
        self.metrics = metrics
        self.client: Analyzer | None = None
        self._refining: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()

    def connect(self, client: Analyzer | None) -> None:
        self.client = client
        self.lifecycle.refiner.remote = None if client is None else self._refine

    def arrived(self, r: LiveRequest) -> None:
        """A new request was queued with the local estimator's bound: ask the analyzer
        for its own in the background (a request never waits for the analyzer)."""
        if self.client is None:
            self.metrics.analyzer_fallbacks.inc()
            return
        self._spawn(self._initial_remote(r))

    async def _initial_remote(self, r: LiveRequest) -> None:
        assert self.client is not None
        try:
            bound = max(1, (await self.client.bounds([r.req]))[0])
        except Exception as err:  # the client should not raise; never fail a request
            log.warning("analyzer bound failed: %s", err)
            self.metrics.analyzer_fallbacks.inc()
            return
        if r.phase in (Phase.WAITING, Phase.RUNNING) and r.bound_refined_at == 0:
            self.lifecycle.refine(r, bound, at=0)

    def observe(self, req: Request, output_tokens: int) -> None:
        if self.client is not None:
            self._spawn(self.client.observe(req, output_tokens))

    def _refine(self, due: list[LiveRequest]) -> None:
        if self._refining is None or self._refining.done():
            self._refining = asyncio.get_running_loop().create_task(self._refine_remote(due))

    async def _refine_remote(self, due: list[LiveRequest]) -> None:
        assert self.client is not None
        generated = [r.generated for r in due]
        try:
            bounds: list[int | None] = list(
                await self.client.bounds([r.req for r in due], generated))
        except Exception as err:
            log.warning("analyzer refine failed: %s", err)
            self.metrics.analyzer_fallbacks.inc(len(due))
            bounds = [None] * len(due)
        for r, g, bound in zip(due, generated, bounds, strict=True):
            if r.phase in (Phase.WAITING, Phase.RUNNING):
                self.lifecycle.refine(r, bound, at=g)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        """Forget the task; a failure is logged (never an unretrieved task exception)."""
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("analyzer call failed: %s", task.exception())
