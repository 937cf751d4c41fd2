"""Discrete-event model of a vLLM-like engine driving the request lifecycle.

Who owns what:
- the *workload* yields requests and compound programs in arrival order;
- the :class:`~jitserve.serving.lifecycle.Lifecycle` (the same one the sidecar drives)
  owns request state, the policy calls, bounds, frames and outcomes;
- this :class:`Engine` is its :class:`~jitserve.serving.interface.Executor`: it owns
  modelled time, KV capacity, chunked prefill, continuous batching, the cost of recompute
  preemption and the wall time of tool calls between the stages of a compound program;
- the *policy* owns the waiting queue and decides order, preemption and retirement, at
  admission time and at every frame boundary (``policy.frame_steps`` iterations).

Speed: decode-only stretches are advanced in closed form (all decoders gain one token per
step; a step's latency grows linearly with the total context), so one simulated hour of
the Azure conversation trace runs in seconds. Per-token delivery times are kept on a
shared timeline of decode-step end times (trimmed as requests finish), from which
latency goodput is counted per request. Memory does not grow with finished requests.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from jitserve.goodput import GoodputLedger
from jitserve.policy import SLOPolicySpec
from jitserve.requests import LiveProgram, LiveRequest, Program, Request, Workitem
from jitserve.scheduling.base import Policy
from jitserve.scheduling.budget import BudgetRule
from jitserve.scheduling.estimators import LengthEstimator, StageShareEstimator
from jitserve.serving.lifecycle import Lifecycle
from jitserve.serving.speed import SpeedMeter
from jitserve.sim.budgeting import constructed_batch, iteration_budget, warm_started
from jitserve.sim.engine_queue import EngineQueue
from jitserve.sim.engine_stats import EngineStats
from jitserve.sim.latency import Profile
from jitserve.sim.timeline import Timeline

STRETCH_OBSERVATIONS = 8
"""Steps of a closed-form decode stretch the step model observes (each the stretch's mean):
as many as a few engine steps, not hundreds, so prefill steps keep their weight."""


@dataclass(slots=True, eq=False)
class _Decoding:
    """Engine-side state of a request in a decode segment."""

    r: LiveRequest
    start_step: int  # global index of the step that delivers token ``start_generated``
    start_generated: int
    finish_step: int  # completed-step count at which the last token is out


class Engine:
    """One replica. Use :meth:`run` for a whole workload, or :meth:`advance` in a loop."""

    def __init__(
        self,
        profile: Profile,
        policy: Policy,
        estimator: LengthEstimator,
        stage_share: StageShareEstimator | None = None,
        ledger: GoodputLedger | None = None,
        refine_every: int = 50,
        budget_rule: BudgetRule = BudgetRule.FIXED,
        batch_constructor: bool = False,
        spec: SLOPolicySpec | None = None,
    ) -> None:
        """``spec``: the settings (admission, preemption) the stack's door runs with
        where ``profile.door`` says the stack has one (None: the defaults)."""
        self.profile = profile
        self.budget_rule = budget_rule
        self.batch_constructor = batch_constructor
        self._budget = profile.chunk_token_budget
        self.step_model = (warm_started(profile) if budget_rule is not BudgetRule.FIXED
                           or batch_constructor else None)
        """What the budget rule and the batch constructor predict steps with (None: neither
        runs): fitted from the simulated steps, as the in-engine scheduler's is from vLLM's."""
        prefill_s = profile.a1_s_per_prefill_token
        self.lifecycle = Lifecycle(
            policy,
            estimator,
            self,
            SpeedMeter(profile.a0_s, prefill_s, prefill_s),
            stage_share=stage_share,
            ledger=ledger,
            refine_every=refine_every,
        )
        if profile.door:
            self.lifecycle.door.configure(spec or SLOPolicySpec())
            self.lifecycle.max_running = profile.max_running
        self.policy = policy
        self.ledger = self.lifecycle.ledger
        self._stats = EngineStats()
        self.now = 0.0
        self.chunked = policy.chunked_prefill
        self._timeline = Timeline()
        self._decoding: dict[LiveRequest, _Decoding] = {}
        self._finish_heap: list[tuple[int, int, _Decoding]] = []
        self._context_offset = 0  # sum over decoders of (context at start - start step)
        self._prefilling: list[LiveRequest] = []
        self._kv_prefill_reserved = 0
        self._events: list[tuple[float, int, Workitem | tuple[LiveProgram, int]]] = []
        self._seq = itertools.count()
        self._steps_since_frame = 0
        self._queue = (EngineQueue(profile.engine_queue, profile.engine_queue_unstarted)
                       if profile.engine_queue else None)

    @property
    def stats(self) -> EngineStats:
        lifecycle = self.lifecycle.stats
        self._stats.preemptions = lifecycle.preemptions
        self._stats.retired = lifecycle.retired
        self._stats.frames = lifecycle.frames
        self._stats.frame_seconds = lifecycle.frame_seconds
        return self._stats

    @property
    def live(self) -> int:
        """Requests (not programs) that are waiting or running."""
        return self.lifecycle.live

    # ---- inputs -----------------------------------------------------------------
    def submit(self, item: Workitem) -> None:
        path = self.profile.request_path_s
        heapq.heappush(self._events, (item.arrival_s + path, next(self._seq), item))

    @property
    def running(self) -> int:
        return len(self._decoding) + len(self._prefilling)

    @property
    def outstanding(self) -> int:
        return self.live + len(self._events)

    def next_event_s(self) -> float:
        return self._events[0][0] if self._events else math.inf

    def switch_policy(self, policy: Policy) -> None:
        """Schedule with ``policy`` from now on (:meth:`Lifecycle.switch_policy`); a
        prompt part-way through prefill goes on in the new policy's batching."""
        self.lifecycle.switch_policy(policy, self.now)
        self.policy = policy
        self.chunked = policy.chunked_prefill

    # ---- arrivals ---------------------------------------------------------------
    def _start_stage(self, lp: LiveProgram, stage: int, at_s: float) -> None:
        self.lifecycle.begin_stage(lp, stage, at_s)
        for req in lp.program.stage_requests(stage, at_s):
            self.lifecycle.arrive(req, self.now, lp)

    def _take_arrivals(self) -> None:
        events = self._events
        while events and events[0][0] <= self.now:
            at_s, _, item = heapq.heappop(events)
            if isinstance(item, Request):
                self.lifecycle.arrive(item, self.now)
            elif isinstance(item, Program):
                self._start_stage(self.lifecycle.open_program(item), 0, at_s)
            else:
                lp, stage = item
                self._start_stage(lp, stage, at_s)

    # ---- KV accounting ------------------------------------------------------------
    def _decode_context(self, step: int | None = None) -> int:
        g = self._timeline.steps if step is None else step
        return self._context_offset + len(self._decoding) * g

    def kv_used_tokens(self) -> int:
        blocks_slack = self.running * self.profile.kv_block_tokens
        return self._decode_context() + self._kv_prefill_reserved + blocks_slack

    # ---- admission ----------------------------------------------------------------
    def _fill(self) -> bool:
        """Admit waiting requests, in policy order, while there is room. As in vLLM v1, a
        waiting request enters the running set only when this iteration's token budget has
        room for (part of) its prefill after the running requests are served; with
        prefill-first batching, while whole prompts fit the prefill budget."""
        profile = self.profile
        if self.chunked:
            pending = sum(r.prefill_target - r.prefilled for r in self._prefilling)
            budget_left = self._budget - len(self._decoding) - pending
        else:
            budget_left = profile.prefill_first_token_budget - self._kv_prefill_reserved
        admitted = False
        queue = self._queue
        if queue is not None:
            queue.top_up(self.lifecycle, self.now, profile.max_running, len(self._prefilling))
        while self.running < profile.max_running and (budget_left > 0 or not self.running):
            r = self.lifecycle.peek_next(self.now) if queue is None else queue.head()
            if r is None:
                break
            need = r.prefill_target + profile.kv_block_tokens
            if self.kv_used_tokens() + need > profile.kv_capacity_tokens:
                break
            if not self.chunked and admitted and r.prefill_target > budget_left:
                break
            started = self.lifecycle.start_next(self.now) if queue is None else queue.take()
            assert started is r
            self._kv_prefill_reserved += r.prefill_target
            self._prefilling.append(r)
            budget_left -= r.prefill_target
            admitted = True
        return admitted

    # ---- the main step ------------------------------------------------------------
    def advance(self, until_s: float = math.inf) -> bool:
        """Run one iteration (or one closed-form decode stretch). False when idle."""
        self._take_arrivals()
        if self.chunked and self.budget_rule is not BudgetRule.FIXED:
            self._budget = self._iteration_budget()
            self._stats.budget_cuts += self._budget < self.profile.chunk_token_budget
        self._fill()
        if self._prefilling:
            self._prefill_iteration()
        elif self._decoding:
            self._decode_stretch(until_s)
        elif self._events:
            self.now = max(self.now, min(self._events[0][0], until_s))
            return True
        elif self.live:
            raise RuntimeError(
                f"engine stalled with {self.live} live requests and nothing runnable "
                f"(waiting={self.policy.waiting()}, kv_used={self.kv_used_tokens()})"
            )
        else:
            return False
        if self._steps_since_frame >= self.policy.frame_steps:
            self._frame()
        return True

    def advance_until(self, until_s: float) -> None:
        """Advance to ``until_s``, or until the engine is idle if that comes first."""
        while self.now < until_s and self.advance(until_s=until_s):
            pass

    def run(self, workload: Iterable[Workitem], until_s: float = math.inf) -> GoodputLedger:
        """Replay ``workload`` on this replica alone, to ``until_s`` (default: until every
        request has its outcome), and return the ledger (several replicas behind a placer:
        :func:`jitserve.sim.cluster.run_cluster`)."""
        for item in workload:
            self.advance_until(item.arrival_s)
            self.submit(item)
        self.advance_until(until_s)
        return self.ledger

    def _prefill_iteration(self) -> None:
        profile = self.profile
        decoders = len(self._decoding) if self.chunked else 0
        budget = (
            self._budget - decoders
            if self.chunked
            else profile.prefill_first_token_budget
        )
        chunks: list[tuple[LiveRequest, int]] = []
        prefill_tokens = 0
        for r in self._prefilling:
            if budget <= 0 and chunks:
                break
            c = min(r.prefill_target - r.prefilled, max(budget, 1))
            prefill_tokens += c
            budget -= c
            chunks.append((r, c))
        decode_context = self._decode_context() if decoders else 0
        if self.step_model is not None and self.batch_constructor and self.chunked:
            full = chunks
            chunks = constructed_batch(self.step_model, self.now, chunks, self._prefilling,
                                       decoders, self._budget - decoders)
            self._stats.constructed += chunks is not full
            prefill_tokens = sum(c for _, c in chunks)
        pairs = sum(c * (r.prefilled + c / 2) for r, c in chunks)
        dt = profile.step_s(prefill_tokens, pairs, decoders, decode_context, decoders + len(chunks))
        self.now += dt
        self._stats.iterations += 1
        self._stats.busy_s += dt
        self._steps_since_frame += 1
        self._stats.prefill_tokens += prefill_tokens
        self.lifecycle.speed.prefill_iteration(dt, prefill_tokens, decoders)
        if self.step_model is not None:
            self.step_model.observe(prefill_tokens + decoders, decoders + len(chunks), dt)
        if decoders:
            self._timeline.extend(np.array([self.now]))
            self._stats.decode_steps += 1
            self._stats.output_tokens += decoders
            self._finish_due()
        for r, c in chunks:
            r.prefilled += c
            if r.prefilled >= r.prefill_target:
                self._prefilling.remove(r)
                self._kv_prefill_reserved -= r.prefill_target
                self._emit_prefill_token(r)

    def _iteration_budget(self) -> int:
        assert self.step_model is not None  # made with a budget rule other than fixed
        g = self._timeline.steps
        tokens = ((d.r, d.start_generated + g - d.start_step) for d in self._decoding.values())
        return iteration_budget(
            self.step_model, self.profile.chunk_token_budget, self.budget_rule, self.now,
            tokens, sum(r.prefill_target - r.prefilled for r in self._prefilling),
            self.policy.waiting() > 0)

    def _emit_prefill_token(self, r: LiveRequest) -> None:
        """The last prefill chunk produces the next token; then the request decodes."""
        self.lifecycle.delivered(r, np.array([self.now]), r.generated)
        self._stats.output_tokens += 1
        true_length = r.req.output_tokens or 1
        if r.generated >= true_length:
            self._finish(r)
            return
        step = self._timeline.steps
        d = _Decoding(r, step, r.generated, step + true_length - r.generated)
        self._decoding[r] = d
        self._context_offset += r.context_tokens - step
        heapq.heappush(self._finish_heap, (d.finish_step, next(self._seq), d))

    def _decode_stretch(self, until_s: float) -> None:
        """Advance m decode-only steps in closed form, stopping at the next event."""
        profile = self.profile
        d = len(self._decoding)
        g = self._timeline.steps
        m = self._finish_heap[0][0] - g
        m = min(m, max(1, self.policy.frame_steps - self._steps_since_frame))
        kv_room = profile.kv_capacity_tokens - self.kv_used_tokens()
        if kv_room < d:
            self._kv_preempt()
            return
        m = max(1, min(m, kv_room // d))
        base = profile.linear_s(d) + profile.a5_s_per_seq * d  # d is fixed in a stretch
        context = self._decode_context()
        j = np.arange(1, m + 1, dtype=np.float64)
        # step i (1-based) sees context + d*(i-1): cumulative sum is closed form
        ends = (
            self.now
            + j * base
            + profile.a4_s_per_context_token * (context * j + d * j * (j - 1) / 2)
        )
        room = self.running < profile.max_running or (
            self._queue is not None
            and self._queue.room(self.lifecycle, profile.max_running, len(self._prefilling)))
        wake = min(until_s, self.next_event_s()) if room else until_s  # an arrival acted on
        if wake < ends[-1]:
            m = max(1, int(np.searchsorted(ends, wake)) + 1)
            ends = ends[:m]
        self._timeline.extend(ends)
        dt = float(ends[-1]) - self.now
        self.lifecycle.speed.decode_stretch(dt, m, d)
        if self.step_model is not None:
            for _ in range(min(m, STRETCH_OBSERVATIONS)):  # the stretch's mean step
                self.step_model.observe(d, d, dt / m)
        self.now = float(ends[-1])
        self._stats.iterations += m
        self._stats.decode_steps += m
        self._stats.busy_s += dt
        self._stats.output_tokens += m * d
        self._steps_since_frame += m
        self._finish_due()

    def _finish_due(self) -> None:
        g = self._timeline.steps
        heap = self._finish_heap
        while heap and heap[0][0] <= g:
            _, _, d = heapq.heappop(heap)
            if self._decoding.get(d.r) is not d:
                continue
            self._close_segment(d, g)
            self._finish(d.r)

    def _close_segment(self, d: _Decoding, completed_steps: int) -> None:
        """Account the tokens of a decode segment and remove it from the batch."""
        r = d.r
        del self._decoding[r]
        stop = min(completed_steps, d.finish_step)
        self._context_offset -= (r.req.prompt_tokens + d.start_generated) - d.start_step
        self.lifecycle.delivered(r, self._timeline.window(d.start_step, stop), d.start_generated)

    # ---- the lifecycle's executor ---------------------------------------------------------
    def sync(self, now_s: float) -> None:
        g = self._timeline.steps
        for d in self._decoding.values():
            self.lifecycle.progress(d.r, d.start_generated + (g - d.start_step))

    def stop(self, r: LiveRequest) -> None:
        d = self._decoding.get(r)
        if d is not None:
            self._close_segment(d, self._timeline.steps)
        elif r in self._prefilling:
            self._prefilling.remove(r)
            self._kv_prefill_reserved -= r.prefill_target
        elif self._queue is not None and r in self._queue:
            self._queue.remove(r)

    # ---- completion, preemption, frames ----------------------------------------------
    def _finish(self, r: LiveRequest) -> None:
        self.lifecycle.finish(r, self.now)
        lp = r.program
        if lp is not None and not lp.ended and not self.lifecycle.stage_open(lp):
            # the stage is done: its tool call runs off-engine, then the next stage arrives
            tool_s = lp.program.stages[lp.stage].tool_s
            at_s = self.now + tool_s + self.profile.request_path_s
            heapq.heappush(self._events, (at_s, next(self._seq), (lp, lp.stage + 1)))

    def _kv_preempt(self) -> None:
        victim = max(self._decoding, key=lambda r: r.started_s or 0.0)
        self._stats.kv_preemptions += 1
        self.lifecycle.preempt(victim, self.now)

    def _frame(self) -> None:
        self._steps_since_frame = 0
        self.lifecycle.frame(self.now, self.profile.max_running)
        self._timeline.trim(
            min((d.start_step for d in self._decoding.values()), default=self._timeline.steps)
        )
