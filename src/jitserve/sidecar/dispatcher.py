"""The sidecar's engine: drives the request lifecycle against a real vLLM (owner: sidecar).

Ownership (the same split as the simulator's ``jitserve.sim.engine``):
- :class:`~jitserve.serving.lifecycle.Lifecycle` owns request state, policy calls,
  bounds, frames and outcomes (the simulator drives the very same one);
- this *dispatcher* is its :class:`~jitserve.serving.lifecycle.Executor` toward vLLM:
  it owns the streams, wall-clock time, what it measures of vLLM's speed, backend health
  and draining, and turns outcomes into client events and metrics.

Dispatch keeps vLLM's batch full. vLLM runs ``max_running`` (B = its ``--max-num-seqs``)
sequences at once; the dispatcher keeps up to ``engine_queue`` more requests queued
*inside* vLLM, so a finished sequence's slot is refilled by vLLM itself within the same
step instead of idling for a round trip through the sidecar. Requests are dispatched in
the policy's order and vLLM's ``priority`` (it runs ``--scheduling-policy priority``) is
the dispatch sequence, so vLLM keeps that order in its own queue and, under KV pressure,
preempts the request the policy ranked last. At each frame (``frame_steps`` decode steps,
timed from observed token gaps) the policy may preempt: the request is aborted in vLLM
(its stream closed) and re-queued; when dispatched again it resumes as a continuation
(prompt + tokens so far, remaining ``max_tokens``), so the client's stream only pauses
and receives every token exactly once, in order.

Failure handling: a broken vLLM stream fails that request with a clear error event and
marks the backend not ready; queued requests stay queued and dispatching resumes when
the health check answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import statistics
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

import numpy as np

from jitserve.goodput import Outcome
from jitserve.policy import SLOPolicySpec
from jitserve.requests import LiveRequest, LLMCall, Phase, Request
from jitserve.scheduling.base import Policy, RetireReason
from jitserve.scheduling.estimators import QuantileEstimator
from jitserve.serving.lifecycle import Lifecycle, Retired
from jitserve.serving.speed import SpeedMeter
from jitserve.sidecar.api import ProgramRef
from jitserve.sidecar.backend import BackendError, BackendUnavailable, Chunk
from jitserve.sidecar.errors import APIError, backend_down, queue_full
from jitserve.sidecar.health import BackendHealth
from jitserve.sidecar.jobs import Event, EventKind, Job
from jitserve.sidecar.metrics import SidecarMetrics
from jitserve.sidecar.programs import ProgramBook, StageShares
from jitserve.slo import CompoundSLO

log = logging.getLogger("jitserve.sidecar")

PolicyFactory = Callable[[SLOPolicySpec], Policy]


class Backend(Protocol):
    """What the dispatcher needs of vLLM (:class:`jitserve.sidecar.backend.VLLMBackend`)."""

    base_url: str

    def stream(self, model: str, prompt_ids: list[int], max_tokens: int,
               sampling: dict[str, Any], priority: int, request_id: str,
               ) -> AsyncIterator[Chunk]: ...

    async def health(self) -> bool: ...

    async def models(self) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class Analyzer(StageShares, Protocol):
    """What the sidecar needs of the analyzer's client
    (:class:`jitserve.analyzer.client.AsyncAnalyzerClient`)."""

    async def bounds(self, reqs: Sequence[Request], generated: Sequence[int] | None = None,
                     ) -> list[int]: ...

    async def observe(self, req: Request, output_tokens: int) -> None: ...


def default_policy_factory(spec: SLOPolicySpec) -> Policy:
    from jitserve.scheduling.registry import make_policy

    return make_policy(spec)


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
        self.engine_queue = max(max_running // 2, 2) if engine_queue is None else engine_queue
        self.clock = clock
        self._factory = policy_factory
        self.analyzer = analyzer
        self.programs = ProgramBook(analyzer)
        # seeded with CPU-ish guesses; measured from the first tokens on
        self.speed = SpeedMeter(decode_step_s=0.02, prefill_s_per_token=1e-3, token_s=1e-3)
        self.lifecycle = Lifecycle(
            policy_factory(spec),
            QuantileEstimator(spec.scheduler.length_quantile),
            self,
            self.speed,
            stage_share=self.programs,
            refine_every=spec.scheduler.refine_every,
        )
        if analyzer is not None:
            self.lifecycle.remote_refine = self._refine_remote
        self.health = BackendHealth(backend, self._on_health, interval_s=health_interval_s)
        self.min_frame_s = min_frame_s
        self.max_frame_s = max_frame_s
        self.jobs: dict[LiveRequest, Job] = {}
        self.service_s = 2.0
        self.dispatch_log: deque[dict[str, Any]] = deque(maxlen=2000)
        self.frame_log: deque[dict[str, Any]] = deque(maxlen=200)
        self.dispatch_gap = DispatchGap()
        self._refining: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._ids = itertools.count()
        self._dispatch_seq = itertools.count()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.draining = False

    @property
    def policy(self) -> Policy:
        return self.lifecycle.policy

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
        self._tasks = [asyncio.create_task(self._frame_loop(), name="jitserve-frames"),
                       asyncio.create_task(self.health.loop(), name="jitserve-health")]

    async def drain(self, timeout_s: float) -> None:
        """Refuse new requests (503) and wait until queued and running ones are done, at
        most ``timeout_s``."""
        self.draining = True
        deadline = time.monotonic() + timeout_s
        while self.jobs and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    async def shutdown(self) -> None:
        for job in list(self.jobs.values()):
            self.fail(job, backend_down(message="the sidecar is shutting down"))
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.backend.close()

    def new_request_id(self, prefix: str) -> str:
        return f"{prefix}-{time.time_ns():x}{next(self._ids):04x}"

    # ---- figures ------------------------------------------------------------------------
    def frame_s(self) -> float:
        frame = self.policy.frame_steps * self.speed.decode_step_s
        return min(max(frame, self.min_frame_s), self.max_frame_s)

    def retry_after_s(self) -> int:
        backlog = self.policy.waiting() / max(self.max_running, 1) * self.service_s
        return int(min(max(math.ceil(backlog), 1), 60))

    def snapshot(self) -> dict[str, Any]:
        running = list(self.lifecycle.running)
        spent = sorted(f["policy_s"] for f in self.frame_log)
        return {
            "policy": self.policy.name,
            "describe": self.policy.describe(),
            "fairness_weight": self.spec.fairness.weight,
            "ready": self.ready,
            "not_ready_reason": None if self.ready else self.health.reason,
            "waiting": self.policy.waiting(),
            "running": len(running),
            "max_running": self.max_running,
            "engine_queue": self.engine_queue,
            "decode_step_s": self.speed.decode_step_s,
            "prefill_s_per_token": self.speed.prefill_s_per_token,
            "frame_s": self.frame_s(),
            "frames": self.lifecycle.stats.frames,
            "policy_ms_p99": spent[int(0.99 * (len(spent) - 1))] * 1e3 if spent else None,
            "dispatch_gap_ms": self.dispatch_gap.summary(),
            "attainment": {k: (None if math.isnan(v) else v)
                           for k, v in self.lifecycle.ledger.attainment().items()},
            "running_requests": [{"request_id": r.req.request_id, "generated": r.generated,
                                  "preemptions": r.preemptions} for r in running],
            "dispatches": list(self.dispatch_log),
            "recent_frames": list(self.frame_log)[-20:],
        }

    def _gauges(self) -> None:
        self.metrics.queue_depth.set(self.policy.waiting())
        self.metrics.running.set(len(self.lifecycle.running))

    # ---- hot reload ---------------------------------------------------------------------
    def apply_spec(self, spec: SLOPolicySpec) -> None:
        """New settings from the policy file; what the policy learned is kept, and on a
        change of scheduler the waiting requests move to the new one."""
        if spec.scheduler.policy == self.spec.scheduler.policy:
            self.policy.configure(spec)
        else:
            self.lifecycle.switch_policy(self._factory(spec), self.clock())
        self.spec = spec
        estimator = self.lifecycle.estimator
        if isinstance(estimator, QuantileEstimator):
            estimator.quantile = spec.scheduler.length_quantile
        self.lifecycle.refine_every = spec.scheduler.refine_every
        self._publish_describe()
        self._wake.set()

    def _publish_describe(self) -> None:
        cutoff = self.policy.describe().get("cutoff")
        if cutoff is not None:
            self.metrics.effective_cutoff.set(cutoff)
        self.metrics.fairness_weight.set(self.spec.fairness.weight)

    # ---- arrivals -----------------------------------------------------------------------
    def check_admission(self) -> None:
        """Raise the APIError a new request gets now (draining, backend down, queue full)."""
        if self.draining:
            self.metrics.rejections.labels("draining").inc()
            raise backend_down(2, "the sidecar is shutting down")
        if not self.ready:
            self.metrics.rejections.labels("backend_down").inc()
            raise backend_down(self.retry_after_s(),
                               f"the model backend is unavailable: {self.health.reason}")
        if self.policy.waiting() >= self.spec.admission.queue_cap:
            self.metrics.rejections.labels("queue_full").inc()
            raise queue_full(self.retry_after_s(),
                             f"the request queue is full ({self.spec.admission.queue_cap} waiting)")

    async def submit(self, req: Request, *, model: str, prompt_ids: list[int], max_tokens: int,
                     sampling: dict[str, Any] | None = None, min_tokens: int = 0,
                     program: ProgramRef | None = None) -> Job:
        """Queue a request; raises APIError (429 queue full, 503 backend down)."""
        self.check_admission()
        bound = await self._initial_bound(req)
        lp = None
        if program is not None:
            assert isinstance(req.slo, CompoundSLO)
            lp = await self.programs.join(self.lifecycle, program, req.tenant, req.slo,
                                          req.slo_class, LLMCall(req.prompt_tokens, max_tokens),
                                          self.clock())
        live = self.lifecycle.arrive(req, self.clock(), lp, bound)
        job = Job(live=live, model=model, prompt_ids=prompt_ids, max_tokens=max_tokens,
                  sampling=sampling or {}, min_tokens=min_tokens)
        self.jobs[live] = job
        self._gauges()
        self._wake.set()
        return job

    async def _initial_bound(self, req: Request) -> int | None:
        """The analyzer's length bound (it answers from its own fallback when slow or
        down); None: the lifecycle's local estimator."""
        if self.analyzer is not None:
            try:
                return max(1, (await self.analyzer.bounds([req]))[0])
            except Exception as err:  # the client should not raise; never fail a request
                log.warning("analyzer bound failed: %s", err)
        self.metrics.analyzer_fallbacks.inc()
        return None

    def _refine_remote(self, due: list[LiveRequest]) -> None:
        if self._refining is None or self._refining.done():
            self._refining = asyncio.create_task(self._refine_with_analyzer(due))

    async def _refine_with_analyzer(self, due: list[LiveRequest]) -> None:
        assert self.analyzer is not None
        generated = [r.generated for r in due]
        try:
            bounds: list[int | None] = list(
                await self.analyzer.bounds([r.req for r in due], generated))
        except Exception as err:
            log.warning("analyzer refine failed: %s", err)
            self.metrics.analyzer_fallbacks.inc(len(due))
            bounds = [None] * len(due)
        for r, g, bound in zip(due, generated, bounds, strict=True):
            if r.phase in (Phase.WAITING, Phase.RUNNING):
                self.lifecycle.refine(r, bound, at=g)

    # ---- dispatch -----------------------------------------------------------------------
    def _admit(self, now: float) -> None:
        while self.ready and len(self.lifecycle.running) < self.depth:
            r = self.lifecycle.start_next(now)
            if r is None:
                break
            self._dispatch(self.jobs[r], now)
        self._gauges()

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
        job.vllm_priority = next(self._dispatch_seq)
        self.dispatch_gap.dispatched(now)
        self.dispatch_log.append({"request_id": job.request_id, "segment": job.segment,
                                  "generated": done, "t": now, "vllm_priority": job.vllm_priority})
        job.task = asyncio.create_task(
            self._run_stream(job, job.segment, job.prompt_ids + job.generated_ids,
                             job.max_tokens - done, sampling, job.vllm_priority),
            name=f"jitserve-{job.request_id}-{job.segment}")

    async def _run_stream(self, job: Job, segment: int, prompt: list[int], max_tokens: int,
                          sampling: dict[str, Any], priority: int) -> None:
        finish: str | None = None
        try:
            async for chunk in self.backend.stream(job.model, prompt, max_tokens, sampling,
                                                   priority, f"{job.request_id}-{segment}"):
                if job.segment != segment:
                    return
                if chunk.token_ids or chunk.text:
                    self._on_tokens(job, chunk.token_ids, chunk.text)
                if chunk.finish_reason is not None:
                    finish = chunk.finish_reason
            if job.segment != segment:
                return
            if finish is None:
                raise BackendUnavailable("backend stream ended without a finish reason")
            self._finish(job, finish)
        except BackendUnavailable as err:
            if job.segment == segment and not job.done:
                log.warning("request %s: backend failed mid-stream: %s", job.request_id, err)
                self.fail(job, APIError(503, f"the model backend failed mid-stream: {err}",
                                        type_="service_unavailable", code="backend_failed",
                                        retry_after_s=2))
                self.health.set(False, str(err))
        except BackendError as err:
            if job.segment == segment and not job.done:
                status = err.status if 400 <= err.status < 500 else 502
                self.fail(job, APIError(status, err.message, param=err.param))
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a bug must not leave a client hanging
            log.exception("request %s: unexpected error", job.request_id)
            if job.segment == segment and not job.done:
                self.fail(job, APIError(500, f"internal error: {err}", type_="server_error"))

    def _on_tokens(self, job: Job, ids: list[int], text: str) -> None:
        now = self.clock()
        live = job.live
        ids = ids[: job.max_tokens - len(job.generated_ids)]  # never more than asked
        n = len(ids)
        if n:
            if job.segment_tokens == 0:
                if not job.queued_in_engine:  # dispatch -> first token measures prefill
                    self.speed.prefill_iteration(now - job.dispatched_s, live.prefill_target, 0)
                job.mark_s, job.mark_tokens = now, live.generated + n
            kind = live.req.kind.value
            if live.first_token_s is None:
                self.metrics.kind_child("ttft", kind).observe(now - live.req.arrival_s)
            elif job.last_token_s is not None:
                self.metrics.kind_child("tbt", kind).observe(now - job.last_token_s)
            job.last_token_s = now
            job.segment_tokens += n
            self.lifecycle.delivered(live, np.full(n, now), live.generated)
            job.generated_ids.extend(ids)
        job.events.put_nowait(Event(EventKind.TOKENS, ids, text))

    # ---- endings ------------------------------------------------------------------------
    def _finish(self, job: Job, finish_reason: str) -> None:
        now = self.clock()
        live = job.live
        if live.program is not None:
            self.programs.call_done(live.program, live.req.prompt_tokens, live.generated)
        self._observe(live.req, live.generated)
        outcome = self.lifecycle.finish(live, now)
        self.dispatch_gap.freed(now, len(self.lifecycle.running) - self.max_running,
                                self.policy.waiting())
        self._close(job, "finished" if outcome is None else _label(outcome))
        if outcome is not None:
            self._count(outcome, _label(outcome))
        if live.started_s is not None:
            self.service_s += 0.1 * (now - live.started_s - self.service_s)
        job.finish_reason = finish_reason
        job.events.put_nowait(Event(EventKind.DONE, finish_reason=finish_reason))

    def fail(self, job: Job, error: APIError) -> None:
        """End ``job`` with ``error`` (backend failure, shutdown)."""
        if job.done:
            return
        outcome = self.lifecycle.fail(job.live, self.clock())
        self._close(job, "error")
        if outcome is not None:
            self._count(outcome, "error")
        job.events.put_nowait(Event(EventKind.ERROR, error=error))

    def cancel(self, job: Job) -> None:
        """The client went away: forget the request, abort it in vLLM if it runs."""
        if job.done:
            return
        self.lifecycle.cancel(job.live, self.clock())
        self._close(job, "cancelled")
        req = job.live.req
        self.metrics.requests.labels(req.tenant, req.kind.value, req.slo_class,
                                     "cancelled").inc()

    def _retired(self, gone: Retired, now: float) -> None:
        self.metrics.retirements.labels(gone.reason.value).inc()
        if gone.outcome is not None:
            self._count(gone.outcome, "retired")
        job = self.jobs.get(gone.request)
        if job is None or job.done:
            return
        self._close(job, "retired")
        if gone.reason is RetireReason.MAX_WAITING:
            limit = self.spec.admission.max_waiting_seconds
            error = queue_full(self.retry_after_s(),
                               f"waiting time exceeded: not scheduled within {limit:g} s")
            error.code = "waiting_time_exceeded"
        else:
            error = APIError(503, "the SLO of this request can no longer be met under the current "
                             "load (retired by overload control)", type_="service_unavailable",
                             code="slo_unreachable", retry_after_s=self.retry_after_s())
        job.events.put_nowait(Event(EventKind.ERROR, error=error))

    def _close(self, job: Job, outcome: str) -> None:
        job.done = True
        job.outcome = outcome
        self.jobs.pop(job.live, None)
        self._gauges()
        self._wake.set()

    def _count(self, outcome: Outcome, label: str) -> None:
        labels = (outcome.tenant, outcome.kind.value, outcome.slo_class)
        self.metrics.requests.labels(*labels, label).inc()
        if outcome.goodput_tokens:
            self.metrics.goodput_tokens.labels(*labels).inc(outcome.goodput_tokens)
        if label in ("met", "missed") and outcome.e2el_s is not None:
            self.metrics.e2el.labels(outcome.kind.value).observe(outcome.e2el_s)

    def _observe(self, req: Request, output_tokens: int) -> None:
        if self.analyzer is not None:
            task = asyncio.create_task(self.analyzer.observe(req, output_tokens))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    # ---- the lifecycle's executor -------------------------------------------------------
    def sync(self, now_s: float) -> None:
        """Running requests' token counts are current: tokens are counted as they come."""

    def stop(self, r: LiveRequest) -> None:
        job = self.jobs.get(r)
        if job is None:
            return
        job.segment += 1  # the old stream's late chunks are ignored
        if job.task is not None and job.task is not asyncio.current_task():
            job.task.cancel()  # closes the stream: vLLM aborts the request
        job.task = None

    # ---- frames -------------------------------------------------------------------------
    def _measure_step(self) -> None:
        """Decode step time from the tokens each running request received since the last
        frame: (time of its last token - mark) / tokens. Averaged over a frame, this is
        robust to vLLM merging several steps into one event when its reader lags."""
        samples = []
        for r in self.lifecycle.running:
            job = self.jobs.get(r)
            if job is None or job.mark_s is None or job.last_token_s is None:
                continue
            tokens = r.generated - job.mark_tokens
            if tokens >= 2 and job.last_token_s > job.mark_s:
                samples.append((job.last_token_s - job.mark_s) / tokens)
                job.mark_s, job.mark_tokens = job.last_token_s, r.generated
        if samples:
            decoders = min(len(self.lifecycle.running), self.max_running)
            self.speed.decode_stretch(statistics.median(samples), 1, decoders)

    def _frame(self, now: float) -> None:
        self._measure_step()
        result = self.lifecycle.frame(now, self.max_running)
        for gone in result.retired:
            self._retired(gone, now)
        self.metrics.preemptions.inc(len(result.preempted))
        for outcome in self.programs.expire(self.lifecycle, now):
            self._count(outcome, _label(outcome))
        self.metrics.frames.inc()
        self.metrics.frame_seconds.observe(result.policy_s)
        self._publish_describe()
        self.frame_log.append({
            "t": now, "policy_s": result.policy_s, "describe": self.policy.describe(),
            "fairness_weight": self.spec.fairness.weight, "waiting": self.policy.waiting(),
            "running": len(self.lifecycle.running),
            "preempted": [r.req.request_id for r in result.preempted],
            "retired": [g.request.req.request_id for g in result.retired],
            "priorities": {r.req.request_id: self.policy.priority_of(r) for r in
                           itertools.islice(itertools.chain(self.lifecycle.running,
                                                            self.lifecycle.waiting), 50)},
        })

    def step(self, now: float, frame_due: bool) -> None:
        """One turn of the loop: a frame if due, then dispatch to the free depth."""
        if frame_due:
            self._frame(now)
        self._admit(now)

    async def _frame_loop(self) -> None:
        last_frame = -math.inf
        while True:
            # the frame length follows the measured step time, re-read at every wake-up
            wait = last_frame + self.frame_s() - self.clock()
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), min(wait, self.min_frame_s * 5))
            self._wake.clear()
            now = self.clock()
            due = now >= last_frame + self.frame_s()
            if due:
                last_frame = now
            try:
                self.step(now, due)
            except Exception:  # a policy bug must not stop the loop
                log.exception("scheduling frame failed")

    def _on_health(self, ready: bool) -> None:
        self.metrics.backend_up.set(1 if ready else 0)
        if ready:
            self._wake.set()


def _label(outcome: Outcome) -> str:
    return "met" if outcome.met else "missed"


class DispatchGap:
    """How long a vLLM batch slot freed by a finished request waits for its next request
    while the sidecar holds work: 0 when a request was already queued inside vLLM (vLLM
    refills the slot in its own next step), else the time until the sidecar dispatches
    one. p50/p99 in ms over the last 4,096 freed slots."""

    def __init__(self) -> None:
        self._freed: deque[float] = deque(maxlen=4096)
        self._gaps: deque[float] = deque(maxlen=4096)

    def freed(self, now: float, queued_in_engine: int, waiting: int) -> None:
        if queued_in_engine > 0:
            self._gaps.append(0.0)
        elif waiting > 0:
            self._freed.append(now)

    def dispatched(self, now: float) -> None:
        if self._freed:
            self._gaps.append(now - self._freed.popleft())

    def summary(self) -> dict[str, float] | None:
        if not self._gaps:
            return None
        gaps = sorted(self._gaps)
        return {"p50": gaps[len(gaps) // 2] * 1e3, "p99": gaps[int(0.99 * (len(gaps) - 1))] * 1e3,
                "count": float(len(gaps))}
