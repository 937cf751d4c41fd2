"""The sidecar's frame loop: drives a scheduling :class:`Policy` against a real vLLM.

Ownership (the same split as the simulator's ``jitserve.sim.engine``):
- this *dispatcher* owns the :class:`~jitserve.requests.LiveRequest` state, the running
  set (requests dispatched to vLLM), time (``time.monotonic``), measured engine speed,
  length-bound refinement, and the per-request outcome (goodput via
  :mod:`jitserve.goodput`);
- the *policy* (from :func:`jitserve.scheduling.registry.make_policy`: GMAX or a
  baseline) owns the waiting queue and decides order, preemption and retirement.

Loop: a request is enqueued on arrival; whenever a slot is free (fewer than
``max_running`` dispatched) the policy's ``pop_next`` is dispatched to vLLM as a streamed
``/v1/completions`` call on token ids, with vLLM's ``priority`` set from the policy's
priority rank so vLLM's own KV-pressure preemption agrees with ours. Every
``frame_steps`` decode steps (timed from observed token gaps) the policy's ``frame``
runs over queued + running requests; its plan is applied at once: a preempted request is
aborted in vLLM (its stream closed) and re-enqueued; when it is dispatched again it
resumes as a continuation (prompt + tokens generated so far, remaining ``max_tokens``),
so the client's stream only pauses and receives every token exactly once, in order.

Failure handling: a broken vLLM stream fails the affected request with a clear error
event and marks the backend not ready (``/ready`` false); queued requests stay queued
and dispatching resumes when the health check answers again.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

import numpy as np

from jitserve.goodput import GoodputLedger, Outcome, latency_tokens_on_time, score_request
from jitserve.policy import SLOPolicySpec
from jitserve.requests import (
    LiveProgram,
    LiveRequest,
    LLMCall,
    Phase,
    Program,
    Request,
    Stage,
)
from jitserve.scheduling.base import EngineView, Policy
from jitserve.scheduling.estimators import QuantileEstimator
from jitserve.sidecar.api import ProgramRef
from jitserve.sidecar.backend import BackendError, BackendUnavailable, VLLMBackend
from jitserve.sidecar.errors import APIError, backend_down, queue_full
from jitserve.sidecar.metrics import SidecarMetrics
from jitserve.slo import CompoundSLO, LatencySLO

log = logging.getLogger("jitserve.sidecar")

PolicyFactory = Callable[[SLOPolicySpec], Policy]


class AsyncBounds(Protocol):
    """What the sidecar needs of the analyzer's client
    (:class:`jitserve.analyzer.client.AsyncAnalyzerClient`)."""

    async def bounds(self, reqs: Sequence[Request], generated: Sequence[int] | None = None,
                     ) -> list[int]: ...

    async def observe(self, req: Request, output_tokens: int) -> None: ...


def default_policy_factory(spec: SLOPolicySpec) -> Policy:
    from jitserve.scheduling.registry import make_policy

    return make_policy(spec)


class EventKind(Enum):
    TOKENS = "tokens"
    DONE = "done"
    ERROR = "error"


@dataclass(slots=True)
class Event:
    kind: EventKind
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    error: APIError | None = None


@dataclass(eq=False)
class Job:
    """One client request inside the sidecar: what to send and what was delivered."""

    live: LiveRequest
    model: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: dict[str, Any] = field(default_factory=dict)
    min_tokens: int = 0
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    generated_ids: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    done: bool = False
    outcome: str | None = None
    finish_reason: str | None = None
    task: asyncio.Task[None] | None = None
    segment: int = 0
    dispatched_s: float = 0.0
    segment_tokens: int = 0
    last_token_s: float | None = None
    mark_s: float | None = None
    mark_tokens: int = 0
    vllm_priority: int = 0

    @property
    def request_id(self) -> str:
        return self.live.req.request_id


class Dispatcher:
    """Queue + running set + frame loop in front of one vLLM."""

    def __init__(
        self,
        backend: VLLMBackend,
        spec: SLOPolicySpec,
        metrics: SidecarMetrics,
        *,
        max_running: int = 16,
        policy_factory: PolicyFactory = default_policy_factory,
        analyzer: AsyncBounds | None = None,
        min_frame_s: float = 0.02,
        max_frame_s: float = 1.0,
        health_interval_s: float = 0.5,
    ) -> None:
        self.backend = backend
        self.metrics = metrics
        self.spec = spec
        self.max_running = max_running
        self._factory = policy_factory
        self.policy = policy_factory(spec)
        self.local_estimator = QuantileEstimator(spec.scheduler.length_quantile)
        self.analyzer = analyzer
        self._refining: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self.min_frame_s = min_frame_s
        self.max_frame_s = max_frame_s
        self.health_interval_s = health_interval_s
        self.jobs: dict[LiveRequest, Job] = {}
        self.waiting: set[Job] = set()
        self.running: set[Job] = set()
        self.programs: dict[tuple[str, str], LiveProgram] = {}
        self.ready = False
        self.not_ready_reason = "backend not checked yet"
        self.health_failures_to_down = 3
        self._health_failures = 0
        self.models: list[str] = []
        # measured engine speed (EWMA), seeded with CPU-ish guesses
        self.decode_step_s = 0.02
        self.prefill_s_per_token = 1e-3
        self.service_s = 2.0
        self.ledger = GoodputLedger()
        self.dispatch_log: deque[dict[str, Any]] = deque(maxlen=2000)
        self.frame_log: deque[dict[str, Any]] = deque(maxlen=200)
        self.frames = 0
        self._ids = itertools.count()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self.draining = False

    # ---- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        await self._check_health()
        self._tasks = [asyncio.create_task(self._frame_loop(), name="jitserve-frames"),
                       asyncio.create_task(self._health_loop(), name="jitserve-health")]

    async def drain(self, timeout_s: float) -> None:
        """Refuse new requests (503) and wait until the queued and running ones are done,
        at most ``timeout_s``."""
        self.draining = True
        deadline = time.monotonic() + timeout_s
        while (self.running or self.waiting) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    async def stop(self) -> None:
        self._stopping = True
        for job in list(self.running) + list(self.waiting):
            self._fail(job, backend_down(message="the sidecar is shutting down"), "error")
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.backend.close()

    def new_request_id(self, prefix: str) -> str:
        return f"{prefix}-{time.time_ns():x}{next(self._ids):04x}"

    # ---- figures -------------------------------------------------------------------------
    def frame_s(self) -> float:
        frame = self.policy.frame_steps * self.decode_step_s
        return min(max(frame, self.min_frame_s), self.max_frame_s)

    def retry_after_s(self) -> int:
        backlog = self.policy.waiting() / max(self.max_running, 1) * self.service_s
        return int(min(max(math.ceil(backlog), 1), 60))

    def describe(self) -> dict[str, float]:
        return self.policy.describe()

    def snapshot(self) -> dict[str, Any]:
        return {
            "policy": self.policy.name,
            "describe": self.describe(),
            "fairness_weight": self.spec.fairness.weight,
            "ready": self.ready,
            "not_ready_reason": None if self.ready else self.not_ready_reason,
            "waiting": self.policy.waiting(),
            "running": len(self.running),
            "max_running": self.max_running,
            "decode_step_s": self.decode_step_s,
            "prefill_s_per_token": self.prefill_s_per_token,
            "frame_s": self.frame_s(),
            "frames": self.frames,
            "policy_ms_p99": self._policy_ms_p99(),
            "attainment": {k: (None if math.isnan(v) else v)
                           for k, v in self.ledger.attainment().items()},
            "running_requests": [{"request_id": j.request_id, "generated": j.live.generated,
                                  "preemptions": j.live.preemptions} for j in self.running],
            "dispatches": list(self.dispatch_log),
            "recent_frames": list(self.frame_log)[-20:],
        }

    def _policy_ms_p99(self) -> float | None:
        spent = sorted(f["policy_s"] for f in self.frame_log)
        return spent[min(len(spent) - 1, int(0.99 * len(spent)))] * 1e3 if spent else None

    def _gauges(self) -> None:
        self.metrics.queue_depth.set(self.policy.waiting())
        self.metrics.running.set(len(self.running))

    # ---- hot reload --------------------------------------------------------------------
    def apply_spec(self, spec: SLOPolicySpec) -> None:
        """New settings from the policy file; waiting requests move to the new policy."""
        now = time.monotonic()
        old = self.policy
        configure = getattr(old, "configure", None)
        if spec.scheduler.policy == self.spec.scheduler.policy and callable(configure):
            configure(spec)
        else:
            new = self._factory(spec)
            for job in self.waiting:
                old.remove(job.live)
                new.enqueue(job.live, now)
            self.policy = new
        self.spec = spec
        self.local_estimator.quantile = spec.scheduler.length_quantile
        self.metrics.fairness_weight.set(spec.fairness.weight)
        self._publish_describe()
        self._wake.set()

    def _publish_describe(self) -> None:
        cutoff = self.policy.describe().get("cutoff")
        if cutoff is not None:
            self.metrics.effective_cutoff.set(cutoff)
        self.metrics.fairness_weight.set(self.spec.fairness.weight)

    # ---- compound programs -------------------------------------------------------------
    def live_program(self, ref: ProgramRef, req_tenant: str, slo: CompoundSLO, slo_class: str,
                     prompt_tokens: int, max_tokens: int, now: float) -> LiveProgram:
        """The program a compound sub-request belongs to (created by its first request)."""
        key = (req_tenant, ref.program_id)
        lp = self.programs.get(key)
        expected = ref.stages or 4
        if lp is not None and lp.open_members <= 0 and (
                ref.stage < lp.stage or (ref.stage == 0 and now > lp.deadline_abs_s)):
            lp = None  # an id used again for a new program: start afresh
        if lp is None:
            call = LLMCall(prompt_tokens, max_tokens)
            program = Program(ref.program_id, req_tenant, now, slo,
                              tuple(Stage((call,)) for _ in range(max(expected, ref.stage + 1))),
                              slo_class=slo_class)
            lp = LiveProgram(program, stage=ref.stage, stage_started_s=now)
            self.programs[key] = lp
        if ref.stage >= lp.stage:
            stages = max(expected, ref.stage + 1)
            if ref.stage > lp.stage:
                lp.stage_started_s = now
            lp.stage = ref.stage
            lp.prev_stage_share = min(1.0, ref.stage / stages)
            lp.stage_share = min(1.0, (ref.stage + 1) / stages)
        lp.open_members += 1
        return lp

    def _expire_programs(self, now: float) -> None:
        for key, lp in list(self.programs.items()):
            if lp.open_members <= 0 and now > lp.deadline_abs_s:
                del self.programs[key]

    # ---- length bounds -------------------------------------------------------------------
    def _local_bound(self, req: Request, generated: int) -> int:
        self.metrics.analyzer_fallbacks.inc()
        return self.local_estimator.bound(req, generated)

    async def initial_bound(self, req: Request) -> int:
        """The analyzer's length bound (it answers from its own fallback when slow or
        down); the local quantile estimator when no analyzer is configured."""
        if self.analyzer is not None:
            try:
                return max(1, (await self.analyzer.bounds([req]))[0])
            except Exception as err:  # the client should not raise; never fail a request
                log.warning("analyzer bound failed: %s", err)
        return self._local_bound(req, 0)

    def _refine_bounds(self) -> None:
        """Refresh the bound of every running request that generated ``refine_every``
        tokens since its last refresh (or outgrew its bound): locally at once, or through
        the analyzer in one batched call applied when it answers."""
        refine = self.spec.scheduler.refine_every
        due = [j for j in self.running
               if j.live.generated - j.live.bound_refined_at >= refine
               or j.live.generated >= j.live.bound]
        if not due:
            return
        if self.analyzer is None:
            for job in due:
                job.live.bound = self._local_bound(job.live.req, job.live.generated)
                job.live.bound_refined_at = job.live.generated
            return
        if self._refining is not None and not self._refining.done():
            return
        self._refining = asyncio.create_task(self._refine_remote(due))

    async def _refine_remote(self, due: list[Job]) -> None:
        assert self.analyzer is not None
        generated = [j.live.generated for j in due]
        try:
            bounds = await self.analyzer.bounds([j.live.req for j in due], generated)
        except Exception as err:
            log.warning("analyzer refine failed: %s", err)
            bounds = [self._local_bound(j.live.req, g) for j, g in zip(due, generated, strict=True)]
        for job, g, bound in zip(due, generated, bounds, strict=True):
            job.live.bound = max(bound, job.live.generated + 1)
            job.live.bound_refined_at = g

    def _observe(self, req: Request, output_tokens: int) -> None:
        self.local_estimator.observe(req, output_tokens)
        if self.analyzer is not None:
            task = asyncio.create_task(self.analyzer.observe(req, output_tokens))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    # ---- admission -----------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Queue a request; raises APIError (429 queue full, 503 backend down)."""
        if self.draining:
            self.metrics.rejections.labels("draining").inc()
            raise backend_down(2, "the sidecar is shutting down")
        if not self.ready:
            self.metrics.rejections.labels("backend_down").inc()
            raise backend_down(self.retry_after_s(), f"the model backend is unavailable: "
                               f"{self.not_ready_reason}")
        if self.policy.waiting() >= self.spec.admission.queue_cap:
            self.metrics.rejections.labels("queue_full").inc()
            raise queue_full(self.retry_after_s(),
                             f"the request queue is full ({self.spec.admission.queue_cap} waiting)")
        now = time.monotonic()
        live = job.live
        if live.bound <= 0:
            live.bound = self._local_bound(live.req, 0)
        live.bound_refined_at = 0
        self.jobs[live] = job
        self.policy.enqueue(live, now)
        self.waiting.add(job)
        self._gauges()
        self._wake.set()

    def cancel(self, job: Job) -> None:
        """The client went away: forget the request, abort it in vLLM if it runs."""
        if job.done:
            return
        now = time.monotonic()
        was_running = job in self.running
        self._detach(job)
        job.live.phase = Phase.RETIRED
        self._record(job, "cancelled", 0, now)
        if was_running:
            self.policy.on_finish(job.live, 0, now)
        self._wake.set()

    def _detach(self, job: Job) -> None:
        """Take ``job`` out of the queue or the running set; closes its vLLM stream."""
        job.done = True
        if job in self.waiting:
            self.waiting.discard(job)
            self.policy.remove(job.live)
        if job in self.running:
            self.running.discard(job)
            job.segment += 1
            if job.task is not None:
                job.task.cancel()
                job.task = None
        if job.live.program is not None:
            job.live.program.open_members -= 1
        self.jobs.pop(job.live, None)
        self._gauges()

    def _admit(self, now: float) -> None:
        while self.ready and len(self.running) < self.max_running:
            r = self.policy.pop_next(now)
            if r is None:
                break
            job = self.jobs.get(r)
            if job is None or job.done:
                continue
            self.waiting.discard(job)
            self._dispatch(job, now)
        self._gauges()

    def _dispatch(self, job: Job, now: float) -> None:
        live = job.live
        live.phase = Phase.RUNNING
        if live.started_s is None:
            live.started_s = now
        live.prefilled = 0
        job.segment += 1
        job.segment_tokens = 0
        job.dispatched_s = now
        job.mark_s = None
        done = len(job.generated_ids)
        remaining = job.max_tokens - done
        sampling = dict(job.sampling)
        if job.min_tokens:
            sampling["min_tokens"] = max(0, job.min_tokens - done)
        # vLLM: lower value = served first; rank by the policy's priority (higher first)
        mine = self.policy.priority_of(live)
        job.vllm_priority = sum(
            1 for other in self.running if self.policy.priority_of(other.live) > mine)
        self.running.add(job)
        self.dispatch_log.append({"request_id": job.request_id, "segment": job.segment,
                                  "generated": done, "t": now, "vllm_priority": job.vllm_priority})
        job.task = asyncio.create_task(
            self._run_stream(job, job.segment, job.prompt_ids + job.generated_ids, remaining,
                             sampling, job.vllm_priority),
            name=f"jitserve-{job.request_id}-{job.segment}")

    # ---- one dispatch ----------------------------------------------------------------------
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
                self._fail(job, APIError(503, f"the model backend failed mid-stream: {err}",
                                         type_="service_unavailable", code="backend_failed",
                                         retry_after_s=2), "error")
                self._set_ready(False, str(err))
        except BackendError as err:
            if job.segment == segment and not job.done:
                status = err.status if 400 <= err.status < 500 else 502
                self._fail(job, APIError(status, err.message, param=err.param), "error")
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a bug must not leave a client hanging
            log.exception("request %s: unexpected error", job.request_id)
            if job.segment == segment and not job.done:
                self._fail(job, APIError(500, f"internal error: {err}", type_="server_error"),
                           "error")

    def _on_tokens(self, job: Job, ids: list[int], text: str) -> None:
        now = time.monotonic()
        live = job.live
        room = job.max_tokens - len(job.generated_ids)
        if len(ids) > room:  # never deliver more than asked, whatever the backend does
            ids = ids[:room]
        n = len(ids)
        if n:
            if job.segment_tokens == 0:
                prefill = live.req.prompt_tokens + live.generated
                self.prefill_s_per_token += 0.2 * ((now - job.dispatched_s) / prefill
                                                   - self.prefill_s_per_token)
                job.mark_s, job.mark_tokens = now, live.generated + n
            kind = live.req.kind.value
            if live.first_token_s is None:
                live.first_token_s = now
                self.metrics.kind_child("ttft", kind).observe(now - live.req.arrival_s)
            elif job.last_token_s is not None:
                self.metrics.kind_child("tbt", kind).observe(now - job.last_token_s)
            job.last_token_s = now
            job.segment_tokens += n
            job.generated_ids.extend(ids)
            job.token_times.extend([now] * n)
            live.generated += n
            live.prefilled = live.prefill_target
        job.events.put_nowait(Event(EventKind.TOKENS, ids, text))

    # ---- endings ---------------------------------------------------------------------------
    def _score(self, job: Job, now: float) -> tuple[int, bool]:
        """Goodput tokens and whether the SLO was met (rules of jitserve.goodput)."""
        live, req = job.live, job.live.req
        slo = req.slo
        ontime = 0
        if isinstance(slo, LatencySLO) and live.program is None:
            ontime = latency_tokens_on_time(np.asarray(job.token_times, dtype=np.float64), 0,
                                            req.arrival_s, slo.ttft_s, slo.tbt_s)
        deadline = live.program.deadline_abs_s if live.program is not None else live.deadline_abs_s
        return score_request(slo, req.prompt_tokens, live.generated, now, deadline, ontime)

    def _finish(self, job: Job, finish_reason: str) -> None:
        now = time.monotonic()
        live = job.live
        self._detach(job)
        live.phase = Phase.FINISHED
        job.finish_reason = finish_reason
        self._observe(live.req, live.generated)
        goodput, met = self._score(job, now)
        self._record(job, "met" if met else "missed", goodput, now, met=met)
        self.policy.on_finish(live, goodput, now)
        if live.started_s is not None:
            self.service_s += 0.1 * (now - live.started_s - self.service_s)
        job.events.put_nowait(Event(EventKind.DONE, finish_reason=finish_reason))
        self._wake.set()

    def _fail(self, job: Job, error: APIError, outcome: str) -> None:
        if job.done:
            return
        now = time.monotonic()
        was_running = job in self.running
        self._detach(job)
        job.live.phase = Phase.RETIRED
        self._record(job, outcome, 0, now)
        if was_running:
            self.policy.on_finish(job.live, 0, now)
        job.events.put_nowait(Event(EventKind.ERROR, error=error))
        self._wake.set()

    def _retire(self, job: Job, now: float) -> None:
        live = job.live
        never_started = live.started_s is None
        limit = self.spec.admission.max_waiting_seconds
        waited_out = never_started and now - live.req.arrival_s > limit
        reason = "max_waiting" if waited_out else "unreachable"
        self.metrics.retirements.labels(reason).inc()
        if waited_out:
            error = queue_full(self.retry_after_s(), "waiting time exceeded: not scheduled within "
                               f"{self.spec.admission.max_waiting_seconds:g} s")
            error.code = "waiting_time_exceeded"
        else:
            error = APIError(503, "the SLO of this request can no longer be met under the current "
                             "load (retired by overload control)", type_="service_unavailable",
                             code="slo_unreachable", retry_after_s=self.retry_after_s())
        was_running = job in self.running
        self._detach(job)
        live.phase = Phase.RETIRED
        goodput = 0
        slo = live.req.slo
        if isinstance(slo, LatencySLO) and live.program is None and job.token_times:
            goodput = latency_tokens_on_time(np.asarray(job.token_times, dtype=np.float64), 0,
                                             live.req.arrival_s, slo.ttft_s, slo.tbt_s)
        self._record(job, "retired", goodput, now, retired=True)
        if was_running or goodput:
            self.policy.on_finish(live, goodput, now)
        job.events.put_nowait(Event(EventKind.ERROR, error=error))

    def _preempt(self, job: Job, now: float) -> None:
        live = job.live
        self.running.discard(job)
        job.segment += 1
        if job.task is not None:
            job.task.cancel()  # closes the stream: vLLM aborts the request
            job.task = None
        live.preemptions += 1
        live.prefill_target = live.req.prompt_tokens + live.generated
        live.prefilled = 0
        self.metrics.preemptions.inc()
        self.policy.enqueue(live, now)
        self.waiting.add(job)

    def _record(self, job: Job, outcome: str, goodput: int, now: float, *, met: bool = False,
                retired: bool = False) -> None:
        job.outcome = outcome
        req = job.live.req
        kind = req.kind.value
        labels = (req.tenant, kind, req.slo_class)
        self.metrics.requests.labels(*labels, outcome).inc()
        if goodput:
            self.metrics.goodput_tokens.labels(*labels).inc(goodput)
        if outcome in ("met", "missed"):
            self.metrics.e2el.labels(kind).observe(now - req.arrival_s)
        if outcome != "cancelled":
            first = job.live.first_token_s
            self.ledger.record(Outcome(req.tenant, req.kind, req.slo_class, req.prompt_tokens,
                                       job.live.generated, goodput, met, retired,
                                       None if first is None else first - req.arrival_s,
                                       now - req.arrival_s))

    # ---- frames ------------------------------------------------------------------------
    def _measure_step(self) -> None:
        """Decode step time from the tokens each running request received since the last
        frame: (time of its last token - mark) / tokens. Averaged over a frame, this is
        robust to vLLM merging several steps into one event when its reader lags."""
        samples = []
        for job in self.running:
            if job.mark_s is None or job.last_token_s is None:
                continue
            tokens = job.live.generated - job.mark_tokens
            if tokens >= 2 and job.last_token_s > job.mark_s:
                samples.append((job.last_token_s - job.mark_s) / tokens)
                job.mark_s, job.mark_tokens = job.last_token_s, job.live.generated
        if samples:
            self.decode_step_s = 0.5 * self.decode_step_s + 0.5 * statistics.median(samples)

    def _frame(self, now: float) -> None:
        self._measure_step()
        self._refine_bounds()
        running = [j.live for j in self.running]
        view = EngineView(now, self.max_running, running, self.decode_step_s,
                          self.prefill_s_per_token, self.decode_step_s / max(len(running), 1))
        started = time.perf_counter()
        plan = self.policy.frame(view)
        spent = time.perf_counter() - started
        priorities = {j.request_id: self.policy.priority_of(j.live)
                      for j in itertools.islice(itertools.chain(self.running, self.waiting), 50)}
        retired, preempted = [], []
        for retirement in plan.retire:
            victim = self.jobs.get(retirement.request)
            if victim is not None and not victim.done:
                self._retire(victim, now)
                retired.append(victim.request_id)
        for r in plan.preempt:
            victim = self.jobs.get(r)
            if victim is not None and victim in self.running:
                self._preempt(victim, now)
                preempted.append(victim.request_id)
        self.frames += 1
        self.metrics.frames.inc()
        self.metrics.frame_seconds.observe(spent)
        self._publish_describe()
        self._expire_programs(now)
        self.frame_log.append({
            "t": now, "policy_s": spent, "describe": self.policy.describe(),
            "fairness_weight": self.spec.fairness.weight, "waiting": self.policy.waiting(),
            "running": len(self.running), "preempted": preempted, "retired": retired,
            "priorities": priorities,
        })

    async def _frame_loop(self) -> None:
        last_frame = -math.inf
        while True:
            # the frame length follows the measured step time, re-read at every wake-up
            wait = last_frame + self.frame_s() - time.monotonic()
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), min(wait, self.min_frame_s * 5))
            self._wake.clear()
            now = time.monotonic()
            try:
                if now >= last_frame + self.frame_s():
                    last_frame = now
                    self._frame(now)
                self._admit(now)
            except Exception:  # a policy bug must not stop the loop
                log.exception("scheduling frame failed")
                last_frame = now

    # ---- backend health ----------------------------------------------------------------
    def _set_ready(self, ready: bool, reason: str = "") -> None:
        """Readiness only gates new work: running streams end by themselves when the
        backend is really gone (their connections break), queued ones wait."""
        if ready != self.ready:
            log.warning("backend %s%s", "ready" if ready else "NOT ready",
                        f": {reason}" if reason else "")
        self.ready = ready
        self.not_ready_reason = reason
        self.metrics.backend_up.set(1 if ready else 0)
        if ready:
            self._health_failures = 0
            self._wake.set()

    async def _check_health(self) -> None:
        ok = await self.backend.health()
        if not ok:
            self._health_failures += 1
            if self.ready and self._health_failures < self.health_failures_to_down:
                return  # one slow answer from a loaded server is not an outage
        if ok and not self.ready:
            try:
                doc = await self.backend.models()
                self.models = [str(m["id"]) for m in doc.get("data", []) if "id" in m]
            except (BackendUnavailable, BackendError) as err:
                self._set_ready(False, f"model list: {err}")
                return
            if not self.models:
                self._set_ready(False, "the backend serves no model")
                return
            self._set_ready(True)
        elif ok:
            self._health_failures = 0
        elif self.ready:
            self._set_ready(False, f"health check of {self.backend.base_url} failed")
        elif not ok:
            self.not_ready_reason = f"health check of {self.backend.base_url} failed"

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s if not self.ready else 1.0)
            try:
                await self._check_health()
            except Exception:
                log.exception("health check failed")
