"""Discrete-event model of a vLLM-like engine driving a scheduling :class:`Policy`.

Who owns what:
- the *workload* yields requests and compound programs in arrival order;
- the :class:`Engine` owns time, the running set, KV capacity, chunked prefill, continuous
  batching, recompute preemption and compound-program stage progression (tool calls take
  wall time off-engine), and reports an :class:`~jitserve.goodput.Outcome` per request;
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
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from jitserve.goodput import (
    GoodputLedger,
    LogHistogram,
    Outcome,
    latency_tokens_on_time,
    score_request,
)
from jitserve.requests import LiveProgram, LiveRequest, Phase, Program, Request, Workitem
from jitserve.scheduling.base import EngineView, Policy
from jitserve.scheduling.estimators import LengthEstimator, StageShareEstimator, UniformStageShare
from jitserve.sim.latency import Profile
from jitserve.slo import LatencySLO


class Timeline:
    """End times of decode steps, indexed by global step number; trimmed from the left."""

    def __init__(self) -> None:
        self._data = np.empty(4096)
        self._base = 0  # global index of _data[0]
        self._len = 0

    @property
    def steps(self) -> int:
        return self._base + self._len

    def extend(self, times: npt.NDArray[np.float64]) -> None:
        need = self._len + times.size
        if need > self._data.size:
            grown = np.empty(max(need, 2 * self._data.size))
            grown[: self._len] = self._data[: self._len]
            self._data = grown
        self._data[self._len : need] = times
        self._len = need

    def window(self, start: int, stop: int) -> npt.NDArray[np.float64]:
        return self._data[start - self._base : stop - self._base]

    def trim(self, keep_from: int) -> None:
        drop = min(keep_from, self.steps) - self._base
        if drop > self._len // 2 and drop > 1024:
            self._data[: self._len - drop] = self._data[drop : self._len]
            self._len -= drop
            self._base += drop


@dataclass(slots=True, eq=False)
class _Decoding:
    """Engine-side state of a request in a decode segment."""

    r: LiveRequest
    start_step: int  # global index of the step that delivers token ``start_generated``
    start_generated: int
    finish_step: int  # completed-step count at which the last token is out


@dataclass
class EngineStats:
    iterations: int = 0
    decode_steps: int = 0
    preemptions: int = 0
    kv_preemptions: int = 0
    retired: int = 0
    output_tokens: int = 0
    prefill_tokens: int = 0
    frames: int = 0
    frame_seconds: LogHistogram = field(default_factory=LogHistogram)
    busy_s: float = 0.0

    def merge(self, other: EngineStats) -> None:
        for name in (
            "iterations",
            "decode_steps",
            "preemptions",
            "kv_preemptions",
            "retired",
            "output_tokens",
            "prefill_tokens",
            "frames",
            "busy_s",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.frame_seconds.merge(other.frame_seconds)


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
    ) -> None:
        self.profile = profile
        self.policy = policy
        self.estimator = estimator
        self.stage_share = stage_share or UniformStageShare()
        self.ledger = ledger or GoodputLedger()
        self.refine_every = refine_every
        self.stats = EngineStats()
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
        self._decode_step_s = profile.a0_s
        self._token_s = profile.a1_s_per_prefill_token
        self._prefill_s = profile.a1_s_per_prefill_token
        self._ontime: dict[LiveRequest, int] = {}
        self._last_token_s: dict[LiveRequest, float] = {}
        self._program_stage_start: dict[LiveProgram, list[float]] = {}
        self._members: dict[LiveProgram, list[LiveRequest]] = {}
        self.live = 0  # requests (not programs) that are waiting or running

    # ---- inputs -----------------------------------------------------------------
    def submit(self, item: Workitem) -> None:
        heapq.heappush(self._events, (item.arrival_s, next(self._seq), item))

    @property
    def running(self) -> int:
        return len(self._decoding) + len(self._prefilling)

    @property
    def outstanding(self) -> int:
        return self.live + len(self._events)

    def next_event_s(self) -> float:
        return self._events[0][0] if self._events else math.inf

    # ---- arrivals ---------------------------------------------------------------
    def _start_request(self, req: Request, program: LiveProgram | None) -> LiveRequest:
        r = LiveRequest(req=req, program=program)
        r.bound = self.estimator.bound(req, 0)
        r.expected = self.estimator.expected(req, 0)
        r.bound_refined_at = 0
        self._ontime[r] = 0
        self.live += 1
        self.policy.enqueue(r, self.now)
        return r

    def _start_stage(self, lp: LiveProgram, stage: int, at_s: float) -> None:
        lp.stage = stage
        lp.stage_started_s = at_s
        lp.prev_stage_share = 0.0 if stage == 0 else lp.stage_share
        lp.stage_share = self.stage_share.stage_share(lp.program, stage)
        members = lp.program.stage_requests(stage, at_s)
        lp.open_members = len(members)
        self._program_stage_start.setdefault(lp, []).append(at_s)
        self._members[lp] = [self._start_request(req, lp) for req in members]

    def _take_arrivals(self) -> None:
        events = self._events
        while events and events[0][0] <= self.now:
            at_s, _, item = heapq.heappop(events)
            if isinstance(item, Request):
                self._start_request(item, None)
            elif isinstance(item, Program):
                self._start_stage(LiveProgram(program=item), 0, at_s)
            else:
                lp, stage = item
                self._start_stage(lp, stage, at_s)

    # ---- KV accounting ------------------------------------------------------------
    def _decode_context(self, step: int | None = None) -> int:
        g = self._timeline.steps if step is None else step
        return self._context_offset + len(self._decoding) * g

    def _kv_used(self) -> int:
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
            budget_left = profile.chunk_token_budget - len(self._decoding) - pending
        else:
            budget_left = profile.prefill_first_token_budget - self._kv_prefill_reserved
        admitted = False
        while self.running < profile.max_running and (budget_left > 0 or not self.running):
            r = self.policy.peek_next(self.now)
            if r is None:
                break
            need = r.prefill_target + profile.kv_block_tokens
            if self._kv_used() + need > profile.kv_capacity_tokens:
                break
            if not self.chunked and admitted and r.prefill_target > budget_left:
                break
            self.policy.pop_next(self.now)
            r.phase = Phase.RUNNING
            if r.started_s is None:
                r.started_s = self.now
            r.prefilled = 0
            self._kv_prefill_reserved += r.prefill_target
            self._prefilling.append(r)
            budget_left -= r.prefill_target
            admitted = True
        return admitted

    # ---- the main step ------------------------------------------------------------
    def advance(self, until_s: float = math.inf) -> bool:
        """Run one iteration (or one closed-form decode stretch). False when idle."""
        self._take_arrivals()
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
                f"(waiting={self.policy.waiting()}, kv_used={self._kv_used()})"
            )
        else:
            return False
        if self._steps_since_frame >= self.policy.frame_steps:
            self._frame()
        return True

    def run(self, workload: Iterable[Workitem]) -> GoodputLedger:
        """Replay ``workload`` on this replica alone and return the ledger."""
        from jitserve.sim.cluster import run_cluster

        return run_cluster([self], workload)

    def _prefill_iteration(self) -> None:
        profile = self.profile
        decoders = len(self._decoding) if self.chunked else 0
        budget = (
            profile.chunk_token_budget - decoders
            if self.chunked
            else profile.prefill_first_token_budget
        )
        chunks: list[tuple[LiveRequest, int]] = []
        prefill_tokens = 0
        pairs = 0.0
        for r in self._prefilling:
            if budget <= 0 and chunks:
                break
            c = min(r.prefill_target - r.prefilled, max(budget, 1))
            pairs += c * (r.prefilled + c / 2)
            prefill_tokens += c
            budget -= c
            chunks.append((r, c))
        decode_context = self._decode_context() if decoders else 0
        dt = profile.step_s(prefill_tokens, pairs, decoders, decode_context, decoders + len(chunks))
        self.now += dt
        self.stats.iterations += 1
        self.stats.busy_s += dt
        self._steps_since_frame += 1
        self.stats.prefill_tokens += prefill_tokens
        self._token_s += 0.05 * (dt / (prefill_tokens + decoders) - self._token_s)
        self._prefill_s += 0.05 * (dt / prefill_tokens - self._prefill_s)
        if decoders:
            self._timeline.extend(np.array([self.now]))
            self.stats.decode_steps += 1
            self.stats.output_tokens += decoders
            self._decode_step_s += 0.1 * (dt - self._decode_step_s)
            self._finish_due()
        for r, c in chunks:
            r.prefilled += c
            if r.prefilled >= r.prefill_target:
                self._prefilling.remove(r)
                self._kv_prefill_reserved -= r.prefill_target
                self._emit_prefill_token(r)

    def _emit_prefill_token(self, r: LiveRequest) -> None:
        """The last prefill chunk produces the next token; then the request decodes."""
        index = r.generated
        r.generated += 1
        self.stats.output_tokens += 1
        if r.first_token_s is None:
            r.first_token_s = self.now
        self._count_token_times(r, np.array([self.now]), index)
        true_length = r.req.output_tokens or 1
        if r.generated >= true_length:
            self._finish(r)
            return
        step = self._timeline.steps
        d = _Decoding(r, step, r.generated, step + true_length - r.generated)
        self._decoding[r] = d
        self._context_offset += r.context_tokens - step
        heapq.heappush(self._finish_heap, (d.finish_step, next(self._seq), d))

    def _count_token_times(
        self, r: LiveRequest, times: npt.NDArray[np.float64], first_index: int
    ) -> None:
        slo = r.req.slo
        if isinstance(slo, LatencySLO) and r.program is None:
            self._ontime[r] += latency_tokens_on_time(
                times, first_index, r.req.arrival_s, slo.ttft_s, slo.tbt_s
            )
        last = self._last_token_s.get(r)
        if times.size:
            gaps = np.diff(times) if last is None else np.diff(times, prepend=last)
            self.ledger.tbt.add_many(gaps)
            self._last_token_s[r] = float(times[-1])

    def _decode_stretch(self, until_s: float) -> None:
        """Advance m decode-only steps in closed form, stopping at the next event."""
        profile = self.profile
        d = len(self._decoding)
        g = self._timeline.steps
        m = self._finish_heap[0][0] - g
        m = min(m, max(1, self.policy.frame_steps - self._steps_since_frame))
        kv_room = profile.kv_capacity_tokens - self._kv_used()
        if kv_room < d:
            self._kv_preempt()
            return
        m = max(1, min(m, kv_room // d))
        base = profile.a0_s + (profile.a3_s_per_decode_seq + profile.a5_s_per_seq) * d
        context = self._decode_context()
        j = np.arange(1, m + 1, dtype=np.float64)
        # step i (1-based) sees context + d*(i-1): cumulative sum is closed form
        ends = (
            self.now
            + j * base
            + profile.a4_s_per_context_token * (context * j + d * j * (j - 1) / 2)
        )
        wake = min(until_s, self.next_event_s()) if self.running < profile.max_running else until_s
        if wake < ends[-1]:
            m = max(1, int(np.searchsorted(ends, wake)) + 1)
            ends = ends[:m]
        self._timeline.extend(ends)
        dt = float(ends[-1]) - self.now
        self._decode_step_s += 0.3 * (dt / m - self._decode_step_s)
        self._token_s += 0.05 * (dt / (m * d) - self._token_s)
        self.now = float(ends[-1])
        self.stats.iterations += m
        self.stats.decode_steps += m
        self.stats.busy_s += dt
        self.stats.output_tokens += m * d
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
        r.generated = d.start_generated + (stop - d.start_step)
        self._context_offset -= (r.req.prompt_tokens + d.start_generated) - d.start_step
        self._count_token_times(r, self._timeline.window(d.start_step, stop), d.start_generated)

    def _sync_generated(self) -> None:
        g = self._timeline.steps
        for d in self._decoding.values():
            d.r.generated = d.start_generated + (g - d.start_step)

    # ---- completion, preemption, retirement -----------------------------------------
    def _finish(self, r: LiveRequest) -> None:
        r.phase = Phase.FINISHED
        self.live -= 1
        self.estimator.observe(r.req, r.generated)
        self._last_token_s.pop(r, None)
        ontime = self._ontime.pop(r, 0)
        lp = r.program
        if lp is not None:
            lp.open_members -= 1
            lp.attained_tokens += r.generated
            if lp.open_members == 0 and not lp.retired:
                self._stage_done(lp, r)
            return
        goodput, met = score_request(
            r.req.slo, r.req.prompt_tokens, r.generated, self.now, r.deadline_abs_s, ontime
        )
        self._record(r, goodput, met)

    def _record(self, r: LiveRequest, goodput: int, met: bool, retired: bool = False) -> None:
        req = r.req
        ttft = None if r.first_token_s is None else r.first_token_s - req.arrival_s
        outcome = Outcome(
            req.tenant,
            req.kind,
            req.slo_class,
            req.prompt_tokens,
            r.generated,
            goodput,
            met,
            retired,
            ttft,
            self.now - req.arrival_s,
        )
        self.ledger.record(outcome)
        self.policy.on_finish(r, goodput, self.now)

    def _stage_done(self, lp: LiveProgram, last: LiveRequest) -> None:
        program = lp.program
        if lp.stage + 1 < len(program.stages):
            tool_s = program.stages[lp.stage].tool_s
            heapq.heappush(self._events, (self.now + tool_s, next(self._seq), (lp, lp.stage + 1)))
            return
        self._members.pop(lp, None)
        starts = self._program_stage_start.pop(lp, [])
        ends = [*starts[1:], self.now]
        self.stage_share.observe_program(
            program, [e - s for s, e in zip(starts, ends, strict=True)]
        )
        outcome = self._record_program(lp, retired=False)
        self.policy.on_finish(last, outcome.goodput_tokens, self.now)

    def _record_program(self, lp: LiveProgram, retired: bool) -> Outcome:
        """One outcome per compound program: all its tokens count if it finished in time."""
        program = lp.program
        goodput, met = (
            (0, False)
            if retired
            else score_request(
                program.slo,
                program.input_tokens,
                program.output_tokens,
                self.now,
                lp.deadline_abs_s,
            )
        )
        outcome = Outcome(
            program.tenant,
            program.slo.kind,
            program.slo_class,
            program.input_tokens,
            program.output_tokens,
            goodput,
            met,
            retired,
            None,
            self.now - program.arrival_s,
        )
        self.ledger.record(outcome)
        return outcome

    def _stop_running(self, r: LiveRequest) -> None:
        d = self._decoding.get(r)
        if d is not None:
            self._close_segment(d, self._timeline.steps)
        elif r in self._prefilling:
            self._prefilling.remove(r)
            self._kv_prefill_reserved -= r.prefill_target
        r.prefilled = 0

    def _preempt(self, r: LiveRequest) -> None:
        self._stop_running(r)
        r.prefill_target = r.req.prompt_tokens + r.generated
        r.preemptions += 1
        self.stats.preemptions += 1
        self.policy.enqueue(r, self.now)

    def _kv_preempt(self) -> None:
        victim = max(self._decoding, key=lambda r: r.started_s or 0.0)
        self.stats.kv_preemptions += 1
        self._preempt(victim)

    def _retire(self, r: LiveRequest) -> None:
        if r.phase is Phase.RUNNING:
            self._stop_running(r)
        elif r.phase is Phase.WAITING:
            self.policy.remove(r)
        else:
            return
        r.phase = Phase.RETIRED
        self.live -= 1
        self.stats.retired += 1
        self._last_token_s.pop(r, None)
        ontime = self._ontime.pop(r, 0)
        lp = r.program
        if lp is None:
            self._record(r, ontime, met=False, retired=True)
            return
        lp.open_members -= 1
        if not lp.retired:
            lp.retired = True
            self._record_program(lp, retired=True)
            self._program_stage_start.pop(lp, None)
            for member in self._members.pop(lp, []):
                self._retire(member)

    def _frame(self) -> None:
        self._steps_since_frame = 0
        self._sync_generated()
        for r in (*self._decoding, *self._prefilling):
            if r.generated - r.bound_refined_at >= self.refine_every or r.generated >= r.bound:
                r.bound = self.estimator.bound(r.req, r.generated)
                r.expected = self.estimator.expected(r.req, r.generated)
                r.bound_refined_at = r.generated
        running = [*self._decoding, *self._prefilling]
        view = EngineView(
            self.now,
            self.profile.max_running,
            running,
            self._decode_step_s,
            self._prefill_s,
            self._token_s,
        )
        started = time.perf_counter()
        plan = self.policy.frame(view)
        self.stats.frame_seconds.add(time.perf_counter() - started)
        self.stats.frames += 1
        for retirement in plan.retire:
            self._retire(retirement.request)
        for r in plan.preempt:
            if r.phase is Phase.RUNNING:
                self._preempt(r)
        self._timeline.trim(
            min((d.start_step for d in self._decoding.values()), default=self._timeline.steps)
        )
