"""The sidecar's engine: drives the request lifecycle against a real vLLM (owner: sidecar).

:class:`~jitserve.serving.lifecycle.Lifecycle` owns request state, policy calls, bounds,
frames and outcomes (the simulator drives the very same one); this dispatcher is its
:class:`~jitserve.serving.interface.Executor` toward vLLM: streams, wall clock, health,
draining, client events.

Dispatch keeps vLLM's batch full: vLLM runs ``max_running`` (B, its ``--max-num-seqs``)
sequences; up to ``engine_queue`` more wait *inside* vLLM, dispatched in the policy's
order with vLLM's ``priority`` = the dispatch sequence (it runs ``--scheduling-policy
priority``), so a freed slot is refilled in vLLM's next step, not after a round trip, and
KV pressure evicts the request the policy ranked last. A preempted request is aborted in
vLLM (stream closed) and later resumed as a continuation (prompt + tokens so far,
remaining ``max_tokens``): the client's stream only pauses, every token arrives once, in
order. A broken stream fails that request with an error event and marks the backend not
ready; queued requests wait for it to come back. A *forwarded* request (structured
outputs, tools, logprobs...: :mod:`~jitserve.sidecar.passthrough`) goes to vLLM's own
endpoint as the client sent it, and is never preempted. Who may enter is
:mod:`~jitserve.sidecar.admission`; when frames come, :mod:`~jitserve.sidecar.frames`.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from jitserve.policy import SLOPolicySpec, default_engine_queue
from jitserve.requests import LiveRequest, LLMCall, Request
from jitserve.scheduling.base import Policy, RetireReason
from jitserve.scheduling.estimators import QuantileEstimator
from jitserve.serving.interface import Retired
from jitserve.serving.lifecycle import Lifecycle
from jitserve.serving.speed import SpeedMeter
from jitserve.sidecar.admission import Admission
from jitserve.sidecar.api import ProgramRef
from jitserve.sidecar.backend import Backend
from jitserve.sidecar.bounds import Analyzer, AnalyzerBounds
from jitserve.sidecar.engine_slo import engine_xargs
from jitserve.sidecar.errors import APIError, shutting_down, ttl_expired
from jitserve.sidecar.frames import FrameClock, FrameLoop
from jitserve.sidecar.health import BackendHealth
from jitserve.sidecar.in_effect import InEffect, PolicyFactory, default_policy_factory
from jitserve.sidecar.jobs import Event, EventKind, Job
from jitserve.sidecar.metrics import SidecarMetrics
from jitserve.sidecar.programs import ProgramBook
from jitserve.sidecar.reporting import Reporter, label, retirement_error
from jitserve.sidecar.streams import ForwardTask, StreamRunner
from jitserve.slo import CompoundSLO


class Dispatcher:
    """Queue + streams + frame loop in front of one vLLM."""

    def __init__(
        self,
        backend: Backend,
        spec: SLOPolicySpec,
        metrics: SidecarMetrics,
        *,
        max_running: int = 16,
        engine_queue: int | None = None,
        engine_queue_unstarted: bool = False,
        policy_factory: PolicyFactory = default_policy_factory,
        analyzer: Analyzer | None = None,
        clock: Callable[[], float] = time.monotonic,
        min_frame_s: float = 0.02,
        max_frame_s: float = 1.0,
        health_interval_s: float = 0.5,
    ) -> None:
        self.backend = backend
        self.metrics = metrics
        self.spec = spec
        self.max_running = max_running
        self.engine_queue = (
            default_engine_queue(max_running) if engine_queue is None else engine_queue)
        self.engine_queue_unstarted = engine_queue_unstarted
        self.clock = clock
        self.in_effect = InEffect(policy_factory, metrics)
        self.programs = ProgramBook()
        # seeded with CPU-ish guesses; measured from the first tokens on
        self.speed = SpeedMeter(decode_step_s=0.02, prefill_s_per_token=1e-3, token_s=1e-3)
        self.lifecycle = Lifecycle(
            self.in_effect.first(spec),
            QuantileEstimator(spec.scheduler.length_quantile),
            self,
            self.speed,
            stage_share=self.programs,
            refine_every=spec.scheduler.refine_every,
        )
        self.lifecycle.max_running = max_running
        self.lifecycle.door.configure(spec)
        self.bounds = AnalyzerBounds(self.lifecycle, metrics)
        self.analyzer = analyzer
        self.health = BackendHealth(backend, self._on_health, interval_s=health_interval_s)
        self.admission = Admission(self.lifecycle, self.health, self.programs, metrics, spec,
                                   max_running)
        self.frame_clock = FrameClock(self.speed, min_frame_s, max_frame_s)
        self.frames = FrameLoop(self.frame_s, self.step, clock, min_frame_s * 5)
        self.jobs: dict[LiveRequest, Job] = {}
        self.report = Reporter(metrics)
        self.streams = StreamRunner(self)
        self._ids = itertools.count()
        self._dispatch_seq = itertools.count()
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def analyzer(self) -> Analyzer | None:
        return self.bounds.client

    @analyzer.setter
    def analyzer(self, client: Analyzer | None) -> None:
        """Length bounds, refinement, stage shares and program history from the analyzer
        (None: the local estimators)."""
        self.bounds.connect(client)
        self.programs.analyzer = client

    @property
    def policy(self) -> Policy:
        return self.lifecycle.policy

    @property
    def scheduler(self) -> str:
        """The name of the scheduler in effect."""
        return self.in_effect.name

    @property
    def ready(self) -> bool:
        return self.health.ready

    @property
    def models(self) -> list[str]:
        return self.health.models

    @property
    def depth(self) -> int:
        """Requests kept inside vLLM: its batch slots plus its queue."""
        return self.max_running + self.engine_queue

    # ---- lifecycle of the dispatcher ----------------------------------------------------
    async def start(self) -> None:
        await self.health.check()
        self._tasks = [asyncio.create_task(self.frames.run(), name="jitserve-frames"),
                       asyncio.create_task(self.health.loop(), name="jitserve-health")]

    async def drain(self, timeout_s: float) -> None:
        """Refuse new requests (503) and wait until queued and running ones are done, at
        most ``timeout_s``."""
        self.admission.draining = True
        deadline = time.monotonic() + timeout_s
        while self.jobs and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def shutdown(self) -> None:
        for job in list(self.jobs.values()):
            self.fail(job, shutting_down())
        for task in self._tasks:
            task.cancel()
        # asyncio.wait, not `suppress(CancelledError): await task`: that swallowed the
        # caller's own cancel (the server bounds this call with asyncio.timeout), so one
        # task or a backend close stuck on a silent vLLM held the exit forever (seen in CI)
        if self._tasks:
            done, _ = await asyncio.wait(self._tasks)
            for task in done:
                if not task.cancelled():
                    task.exception()  # retrieved: an error here is the task's, not ours
        await self.backend.close()

    def new_request_id(self, prefix: str) -> str:
        return f"{prefix}-{time.time_ns():x}{next(self._ids):04x}"

    # ---- figures ------------------------------------------------------------------------
    def frame_s(self) -> float:
        return self.frame_clock.frame_s(self.policy.frame_steps)

    def snapshot(self) -> dict[str, Any]:
        return self.report.snapshot(self.lifecycle, self.spec, self.health, self.speed, {
            "max_running": self.max_running, "engine_queue": self.engine_queue,
            "engine_queue_unstarted": self.engine_queue_unstarted, "frame_s": self.frame_s(),
            "in_effect": self.in_effect.as_dict()})

    def update_gauges(self) -> None:
        """Set the waiting and running gauges to now's counts (also before a scrape)."""
        self.report.gauges(self.policy.waiting(), len(self.lifecycle.running))

    # ---- hot reload ---------------------------------------------------------------------
    def apply_spec(self, spec: SLOPolicySpec) -> None:
        """New settings from the policy file (:class:`InEffect` says what happens to the
        scheduler)."""
        self.in_effect.apply(self.lifecycle, spec, self.clock())
        self.spec = spec
        self.admission.configure(spec)
        self.lifecycle.door.configure(spec)
        estimator = self.lifecycle.estimator
        if isinstance(estimator, QuantileEstimator):
            estimator.quantile = spec.scheduler.length_quantile
        self.lifecycle.refiner.every = spec.scheduler.refine_every
        self.report.describe(self.policy)
        self.frames.wake()

    def use_scheduler(self, name: str) -> None:
        """Run ``name``, a candidate of ``scheduler.policy: auto`` (the tuner's choice)."""
        if self.in_effect.apply(self.lifecycle, self.spec, self.clock(), choice=name):
            self.report.describe(self.policy)
            self.frames.wake()

    # ---- arrivals -----------------------------------------------------------------------
    async def submit(self, req: Request, *, model: str, prompt_ids: list[int], max_tokens: int,
                     sampling: dict[str, Any] | None = None, min_tokens: int = 0,
                     program: ProgramRef | None = None,
                     events: asyncio.Queue[Event] | None = None,
                     forward: dict[str, Any] | None = None, forward_path: str = "",
                     queue_ttl_s: float | None = None) -> Job:
        """Queue a request; raises APIError (429 queue full, 503 backend down). ``events``:
        the queue its handler reads (the server's is bounded for slow readers).
        ``queue_ttl_s``: not dispatched by then, it ends with 429 ``ttl_expired``."""
        self.admission.check()
        lp = None
        if program is not None:
            assert isinstance(req.slo, CompoundSLO)
            lp = await self.programs.join(self.lifecycle, program, req.tenant, req.slo,
                                          req.slo_class, LLMCall(req.prompt_tokens, max_tokens),
                                          self.clock())
        live = self.lifecycle.arrive(req, self.clock(), lp)
        if self.lifecycle.refused:
            for gone in self.lifecycle.refused:
                self.report.retired(gone)
            raise retirement_error(RetireReason.WOULD_START_LATE, self.admission.retry_after_s(),
                                   self.spec.admission)
        self.bounds.arrived(live)
        job = Job(live=live, model=model, prompt_ids=prompt_ids, max_tokens=max_tokens,
                  sampling=sampling or {}, min_tokens=min_tokens, forward=forward,
                  forward_path=forward_path)
        if events is not None:
            job.events = events
        self.jobs[live] = job
        if queue_ttl_s is not None:
            job.ttl_timer = asyncio.get_running_loop().call_later(
                queue_ttl_s, self._expire, job, queue_ttl_s)
        self.update_gauges()
        self.frames.wake()
        return job

    # ---- dispatch -----------------------------------------------------------------------
    def _admit(self, now: float) -> None:
        room = (self.engine_queue - self._unstarted() if self.engine_queue_unstarted
                else math.inf)  # dispatches the unstarted rule allows
        while self.ready and len(self.lifecycle.running) < self.depth and room > 0:
            r = self.lifecycle.start_next(now)
            if r is None:
                break
            self._dispatch(self.jobs[r], now)
            room -= 1
        self.update_gauges()

    def _unstarted(self) -> int:
        """Dispatched requests on the token path with no token yet in their dispatch:
        waiting in vLLM or in their prefill (a forwarded request says nothing of it)."""
        return sum(1 for r in self.lifecycle.running
                   if (job := self.jobs[r]).forward is None and job.segment_tokens == 0)

    def _dispatch(self, job: Job, now: float) -> None:
        job.segment += 1
        job.segment_tokens = 0
        job.dispatched_s = now
        job.queued_in_engine = len(self.lifecycle.running) > self.max_running
        job.mark_s = None
        done = len(job.generated_ids)
        sampling = dict(job.sampling)
        if job.min_tokens:
            sampling["min_tokens"] = max(0, job.min_tokens - done)
        sampling["vllm_xargs"] = {**(sampling.get("vllm_xargs") or {}),
                                  **engine_xargs(job.live, done, now, time.time())}
        job.vllm_priority = next(self._dispatch_seq)
        self.report.dispatched(job, now)
        if job.forward is not None:
            job.dispatch = ForwardTask(asyncio.create_task(
                self.streams.forward(job, job.segment),
                name=f"jitserve-{job.request_id}-{job.segment}"))
        else:
            job.dispatch = self.streams.generate(
                job, job.segment, job.prompt_ids + job.generated_ids, job.max_tokens - done,
                sampling, job.vllm_priority)

    def on_tokens(self, job: Job, ids: list[int], text: str,
                   raw: dict[str, Any] | None = None) -> None:
        now = self.clock()
        live = job.live
        ids = ids[: job.max_tokens - len(job.generated_ids)]  # never more than asked
        n = len(ids)
        if n:
            if job.segment_tokens == 0:
                if not job.queued_in_engine:  # dispatch -> first token measures prefill
                    self.speed.prefill_iteration(now - job.dispatched_s, live.prefill_target, 0)
                job.mark_s, job.mark_tokens = now, live.generated + n
                if self.engine_queue_unstarted:
                    self.frames.wake()  # room in the engine queue
            self.report.tokens(job, n, now)
            job.last_token_s = now
            job.segment_tokens += n
            self.lifecycle.delivered(live, now if n == 1 else np.full(n, now), live.generated)
            job.generated_ids.extend(ids)
        # a forwarded chunk counts as one waiting item however many tokens it holds
        job.events.put_nowait(Event(EventKind.TOKENS, ids if raw is None else [], text, raw=raw))

    # ---- endings ------------------------------------------------------------------------
    def finish(self, job: Job, finish_reason: str) -> None:
        now = self.clock()
        live = job.live
        if live.program is not None:
            self.programs.call_done(live.program, live.req.prompt_tokens, live.generated)
        self.bounds.observe(live.req, live.generated)
        outcome = self.lifecycle.finish(live, now)
        self.report.slot_freed(now, len(self.lifecycle.running) - self.max_running,
                               self.policy.waiting())
        self._close(job, "finished" if outcome is None else label(outcome))
        if outcome is not None:
            self.report.outcome(outcome, label(outcome))
        if live.started_s is not None:
            self.admission.served(now - live.started_s)
        job.finish_reason = finish_reason
        job.events.put_nowait(Event(EventKind.DONE, finish_reason=finish_reason))

    def fail(self, job: Job, error: APIError) -> None:
        """End ``job`` with ``error`` (backend failure, shutdown)."""
        if job.done:
            return
        outcome = self.lifecycle.fail(job.live, self.clock())
        self._close(job, "error")
        if outcome is not None:
            self.report.outcome(outcome, "error")
        job.events.put_nowait(Event(EventKind.ERROR, error=error))

    def cancel(self, job: Job) -> None:
        """The client went away: forget the request, abort it in vLLM if it runs."""
        if job.done:
            return
        self.lifecycle.cancel(job.live, self.clock())
        self._close(job, "cancelled")
        self.report.dropped(job.live.req, "cancelled")

    def _expire(self, job: Job, ttl_s: float) -> None:
        """Its queue TTL ran out: if it was never dispatched, it leaves the queue (llm-d's
        ``rejected-ttl-expired``); once dispatched the TTL no longer applies."""
        if job.done or job.segment > 0:
            return
        self.lifecycle.cancel(job.live, self.clock())
        self._close(job, "ttl_expired")
        self.report.dropped(job.live.req, "ttl_expired")
        job.events.put_nowait(Event(EventKind.ERROR,
                                    error=ttl_expired(ttl_s, self.admission.retry_after_s())))

    def _retired(self, gone: Retired) -> None:
        self.report.retired(gone)
        job = self.jobs.get(gone.request)
        if job is None or job.done:
            return
        self._close(job, "retired")
        error = retirement_error(gone.reason, self.admission.retry_after_s(), self.spec.admission,
                                 streaming=job.live.first_token_s is not None)
        job.events.put_nowait(Event(EventKind.ERROR, error=error))

    def _close(self, job: Job, outcome: str) -> None:
        job.done = True
        if job.ttl_timer is not None:
            job.ttl_timer.cancel()
        job.outcome = outcome
        self.report.ended(job.live)
        self.jobs.pop(job.live, None)
        self.update_gauges()
        self.frames.wake()

    # ---- the lifecycle's executor -------------------------------------------------------
    def sync(self, now_s: float) -> None:
        """Running requests' token counts are current: tokens are counted as they come."""

    def stop(self, r: LiveRequest) -> None:
        job = self.jobs.get(r)
        if job is None:
            return
        job.segment += 1  # the old stream's late chunks are ignored
        if job.dispatch is not None:
            job.dispatch.abort()  # closes the stream: vLLM aborts the request
        job.dispatch = None

    # ---- frames -------------------------------------------------------------------------
    def _frame(self, now: float) -> None:
        self.report.door_margin(self.lifecycle.door.margin_s(now))
        self.frame_clock.measure(((r, self.jobs.get(r)) for r in self.lifecycle.running),
                           self.max_running)
        result = self.lifecycle.frame(now, self.max_running)
        for gone in result.retired:
            self._retired(gone)
        for outcome in self.programs.expire(self.lifecycle, now):
            self.report.outcome(outcome, label(outcome))
        self.report.frame(now, result, self.policy,
                          itertools.chain(self.lifecycle.running, self.lifecycle.waiting),
                          len(self.lifecycle.running))

    def step(self, now: float, frame_due: bool) -> None:
        """One turn of the loop: a frame if due, then dispatch to the free depth."""
        if frame_due:
            self._frame(now)
        self._admit(now)

    def _on_health(self, ready: bool) -> None:
        self.report.backend(ready)
        if ready:
            self.frames.wake()
