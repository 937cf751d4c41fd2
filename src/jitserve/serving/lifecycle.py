"""THE request lifecycle: one core that the simulator and the sidecar both drive.

Like vLLM v1's scheduler core, this module is synchronous, does no I/O and is told the
time. It owns every state change of a :class:`~jitserve.requests.LiveRequest` and a
:class:`~jitserve.requests.LiveProgram`, one method per change, each asserting its
precondition:

    arrive -> (start_next -> delivered* -> finish | preempt -> start_next ...)
                                             | retire | cancel | fail
            | withdraw (a copy, late binding: another replica started it)

A program's side of these changes (its open calls, stage starts and shares, its end) is
:class:`~jitserve.serving.programs.LivePrograms`, which only the lifecycle drives.

It also builds the :class:`~jitserve.scheduling.base.EngineView` a policy plans with,
applies the policy's :class:`~jitserve.scheduling.base.FramePlan`, has length bounds and
expected lengths refined (:class:`~jitserve.serving.refinement.BoundRefiner`, at arrival
and at each frame), and records one :class:`~jitserve.goodput.Outcome` per request and
per compound program, scored by :mod:`jitserve.goodput`. The engine driving it
(``jitserve.sim.engine`` with modelled time and KV, ``jitserve.sidecar.dispatcher`` with
vLLM streams) is an :class:`~jitserve.serving.interface.Executor`: it runs what the
lifecycle starts and stops what the lifecycle stops; the plain data it gets back is in
:mod:`~jitserve.serving.interface` too.
"""

from __future__ import annotations

import time

import numpy as np
import numpy.typing as npt

from jitserve.goodput import GoodputLedger, Outcome, latency_tokens_on_time, score_request
from jitserve.policy import SLOPolicySpec
from jitserve.requests import LiveProgram, LiveRequest, Phase, Program, Request
from jitserve.scheduling.base import EngineView, Policy, RetireReason
from jitserve.scheduling.estimators import LengthEstimator, StageShareEstimator, UniformStageShare
from jitserve.scheduling.slack import is_latency
from jitserve.serving.forecast import DoorView, FirstTokenForecast
from jitserve.serving.interface import (
    Copies,
    Executor,
    FrameResult,
    LifecycleStats,
    Retired,
    TrafficObserver,
)
from jitserve.serving.outcomes import request_outcome
from jitserve.serving.programs import LivePrograms
from jitserve.serving.refinement import BoundRefiner
from jitserve.serving.speed import SpeedMeter
from jitserve.slo import LatencySLO


class Lifecycle:
    def __init__(
        self,
        policy: Policy,
        estimator: LengthEstimator,
        executor: Executor,
        speed: SpeedMeter,
        *,
        stage_share: StageShareEstimator | None = None,
        ledger: GoodputLedger | None = None,
        refine_every: int = 50,
    ) -> None:
        self.policy = policy
        self._parked: dict[str, Policy] = {}
        self.estimator = estimator
        self.executor = executor
        self.speed = speed
        self.ledger = ledger or GoodputLedger()
        self.refiner = BoundRefiner(estimator, refine_every)
        """Refreshes length bounds (its ``every`` and ``remote`` are the driver's to set)."""
        self.refused: list[Retired] = []
        """What the door retired at the last :meth:`arrive` (empty: it waits)."""
        self.copies: Copies | None = None
        """Set by a fleet that late-binds requests across replicas (:class:`Copies`)."""
        self.observer: TrafficObserver | None = None
        """Set by a driver whose traffic is recorded (the tuner's); None: not recorded."""
        self.stats = LifecycleStats()
        self.programs = LivePrograms(stage_share or UniformStageShare())
        self.running: dict[LiveRequest, None] = {}
        """Running requests in the order they started."""
        self.live = 0
        """Requests (not programs) waiting or running."""
        self._ontime: dict[LiveRequest, int] = {}
        self._last_token_s: dict[LiveRequest, float] = {}
        self.door = FirstTokenForecast()
        """The on-time check of latency arrivals (``admission.onTimeQuantile``)."""
        self.max_running = 0
        """B, for the door's forecast (set by the driver; 0: no door check)."""
        self._forecast: dict[LiveRequest, tuple[float, float]] = {}
        """Latency arrivals waiting for their first token: (forecast s, arrived at)."""

    @property
    def waiting(self) -> list[LiveRequest]:
        """The waiting requests, in the order they came to wait; the policy's queue is
        their one owner (and their order of service is the policy's)."""
        return self.policy.waiting_requests()

    # ---- arrivals ---------------------------------------------------------------------
    def open_program(self, program: Program) -> LiveProgram:
        return LiveProgram(program=program)

    def begin_stage(
        self,
        lp: LiveProgram,
        stage: int,
        now_s: float,
        *,
        share: float | None = None,
        final: bool | None = None,
    ) -> None:
        """Stage ``stage`` of ``lp`` starts: its sub-deadline is ``share`` of the program's
        deadline (default: the stage-share estimator's phi(stage))."""
        self.programs.begin_stage(lp, stage, now_s, share, final)

    def arrive(
        self,
        req: Request,
        now_s: float,
        program: LiveProgram | None = None,
        bound: int | None = None,
    ) -> LiveRequest:
        """``req`` arrives (a compound call: in ``program``'s current stage) and waits,
        unless the door retires it at once (a latency request whose first token is
        forecast past its target, :mod:`~jitserve.serving.forecast`): then its phase is
        RETIRED and its outcome recorded, and :attr:`refused` holds it."""
        self.refused = []
        r = LiveRequest(req=req, program=program)
        self.refine(r, bound)
        self._ontime[r] = 0
        self.live += 1
        if program is not None:
            self.programs.joined(program, r)
        self.policy.enqueue(r, now_s)
        if self.observer is not None:
            self.observer.arrived(r, now_s)
        self._at_door(r, now_s)
        return r

    def _at_door(self, r: LiveRequest, now_s: float) -> None:
        slo = r.req.slo
        if not isinstance(slo, LatencySLO) or r.program is not None or self.max_running <= 0:
            return
        holding = sum(1 for x in self.running
                      if not self.door.others_yield or is_latency(x) or not x.req.preemptible)
        forecast = self.door.forecast_s(DoorView(
            ahead=self.policy.ahead_of(r), running=holding,
            max_running=self.max_running,
            prefill_s=r.prefill_target * self.speed.prefill_s_per_token
            + self.speed.decode_step_s))
        if self.door.late(forecast, r.req.arrival_s + slo.ttft_s - now_s, now_s):
            self.refused = self.retire(r, RetireReason.WOULD_START_LATE, now_s)
            return
        self._forecast[r] = (forecast, now_s)

    # ---- running ------------------------------------------------------------------------
    def peek_next(self, now_s: float) -> LiveRequest | None:
        return self.policy.peek_next(now_s, len(self.running))

    def start_next(self, now_s: float) -> LiveRequest | None:
        """The policy's next waiting request starts running (or None: nothing waits)."""
        r = self.policy.pop_next(now_s, len(self.running))
        if r is None:
            return None
        assert r.phase is Phase.WAITING, f"{r.req.request_id} started while {r.phase.value}"
        r.phase = Phase.RUNNING
        if r.started_s is None:
            r.started_s = now_s
        r.prefilled = 0
        self.running[r] = None
        if self.copies is not None:
            self.copies.started(r, now_s)
        return r

    def progress(self, r: LiveRequest, generated: int) -> None:
        """The engine's count of ``r``'s tokens so far (before they are delivered)."""
        assert r.phase is Phase.RUNNING and generated >= r.generated
        r.generated = generated

    def delivered(
        self, r: LiveRequest, times: npt.NDArray[np.float64] | float, first_index: int
    ) -> None:
        """Tokens ``first_index, first_index+1, ...`` of ``r`` reached the client at
        ``times`` (a float: one token, the sidecar's hot path): count those on the latency
        timeline and the gaps between tokens."""
        assert r.phase is Phase.RUNNING, f"tokens for {r.req.request_id} while {r.phase.value}"
        if isinstance(times, float):
            count, first = 1, times
        elif times.size:
            count, first = int(times.size), float(times[0])
        else:
            return
        if r.first_token_s is None:
            r.first_token_s = first
            forecast = self._forecast.pop(r, None)
            if forecast is not None:
                self.door.observed(forecast[0], first - forecast[1], first)
        r.generated = max(r.generated, first_index + count)
        r.prefilled = r.prefill_target
        slo = r.req.slo
        last = self._last_token_s.get(r)
        if count == 1:  # one streamed token: no arrays
            at = first
            if isinstance(slo, LatencySLO) and r.program is None:
                due = slo.due_s(r.req.arrival_s, first_index)
                self._ontime[r] += at <= due + 1e-9
            if last is not None:
                self.ledger.tbt.add(at - last)
            self._last_token_s[r] = at
            return
        assert not isinstance(times, float)
        if isinstance(slo, LatencySLO) and r.program is None:
            self._ontime[r] += latency_tokens_on_time(times, first_index, r.req.arrival_s, slo)
        gaps = np.diff(times) if last is None else np.diff(times, prepend=last)
        self.ledger.tbt.add_many(gaps)
        self._last_token_s[r] = float(times[-1])

    # ---- endings ------------------------------------------------------------------------
    def finish(self, r: LiveRequest, now_s: float) -> Outcome | None:
        """``r`` produced its last token. Returns its outcome, or its program's when it
        was the last call of the program's final stage, else None (the program goes on:
        :meth:`stage_open` says whether its stage is still open)."""
        assert r.phase is Phase.RUNNING, f"{r.req.request_id} finished while {r.phase.value}"
        del self.running[r]
        r.phase = Phase.FINISHED
        self.live -= 1
        if r.first_token_s is not None:
            self.door.held_slot(now_s - r.first_token_s
                                + r.prefill_target * self.speed.prefill_s_per_token)
        self.estimator.observe(r.req, r.generated)
        if self.observer is not None:
            self.observer.finished(r, now_s)
        self._last_token_s.pop(r, None)
        ontime = self._ontime.pop(r, 0)
        lp = r.program
        if lp is None:
            goodput, met = score_request(
                r.req.slo, r.req.prompt_tokens, r.generated, now_s, r.deadline_abs_s, ontime
            )
            self.policy.on_finish(r, goodput, now_s)
            return self._record_request(r, goodput, met, now_s)
        outcome = self._recorded(self.programs.finished(lp, r, now_s))
        self.policy.on_finish(r, 0 if outcome is None else outcome.goodput_tokens, now_s)
        return outcome

    def stage_open(self, lp: LiveProgram) -> bool:
        return lp.open_members > 0

    def expire_program(self, lp: LiveProgram, now_s: float) -> Outcome | None:
        """A program whose client never said its last call came ends at its deadline,
        once no call of it is open (missed)."""
        return self._recorded(self.programs.expire(lp, now_s))

    def preempt(self, r: LiveRequest, now_s: float) -> None:
        """Stop ``r`` and put it back in the queue; its tokens are kept and it resumes
        with prompt + generated as its new prefill."""
        assert r.phase is Phase.RUNNING, f"preempting {r.req.request_id} while {r.phase.value}"
        self.executor.stop(r)
        del self.running[r]
        r.prefill_target = r.req.prompt_tokens + r.generated
        r.prefilled = 0
        r.preemptions += 1
        r.phase = Phase.WAITING
        self.stats.preemptions += 1
        self.policy.enqueue(r, now_s)

    def retire(self, r: LiveRequest, reason: RetireReason, now_s: float) -> list[Retired]:
        """Overload control gives up on ``r`` (and on the rest of its program). A waiting
        copy of a late-bound request whose other copies still wait elsewhere is withdrawn
        instead: the request is retired when its last copy goes."""
        if r.phase is Phase.WAITING and self.copies is not None and self.copies.leaving(r):
            self.withdraw(r)
            return []
        if not self._leave(r):
            return []
        self.stats.retired += 1
        ontime = self._ontime.pop(r, 0)
        lp = r.program
        if lp is None:
            outcome = self._record_request(r, ontime, False, now_s, retired=True)
            self.policy.on_finish(r, ontime, now_s)
            return [Retired(r, reason, outcome)]
        self.policy.on_finish(r, 0, now_s)
        if lp.ended:
            return [Retired(r, reason, None)]
        outcome, others = self.programs.retire(lp, now_s)
        gone = [Retired(r, reason, self._recorded(outcome))]
        for member in others:
            gone += self.retire(member, reason, now_s)
        return gone

    def cancel(self, r: LiveRequest, now_s: float) -> None:
        """The client went away: no outcome is recorded."""
        if self._leave(r):
            self._ontime.pop(r, None)
            self.policy.on_finish(r, 0, now_s)

    def fail(self, r: LiveRequest, now_s: float) -> Outcome | None:
        """The backend failed ``r``: it earned nothing (a compound call's program goes on
        and is scored when it ends)."""
        if not self._leave(r):
            return None
        self._ontime.pop(r, None)
        self.policy.on_finish(r, 0, now_s)
        return None if r.program is not None else self._record_request(r, 0, False, now_s)

    def withdraw(self, r: LiveRequest) -> None:
        """A waiting copy of ``r`` (late binding, :class:`Copies`) leaves this replica's
        queue without an outcome: another replica started it, or this one gave up on it
        while another copy still waits. The policy forgets it (no goodput is credited)."""
        assert r.phase is Phase.WAITING, f"withdrawing {r.req.request_id} while {r.phase.value}"
        assert r.program is None, "a compound call is never copied"
        self.policy.remove(r)
        r.phase = Phase.WITHDRAWN
        self.live -= 1
        self._ontime.pop(r, None)
        self.refiner.forget(r)
        self._forecast.pop(r, None)

    def _leave(self, r: LiveRequest) -> bool:
        """Take a waiting or running ``r`` out; False if it already left."""
        if r.phase is Phase.WAITING:
            self.policy.remove(r)
        elif r.phase is Phase.RUNNING:
            self.executor.stop(r)
            del self.running[r]
        else:
            return False
        r.phase = Phase.RETIRED
        self.live -= 1
        self._last_token_s.pop(r, None)
        self._forecast.pop(r, None)
        if r.program is not None:
            self.programs.left(r.program, r)
        return True

    def switch_policy(self, policy: Policy, now_s: float) -> None:
        """Hot reload to another scheduler: the waiting requests move to it, in the order
        they came to wait; the running ones run on (the new policy sees them at its first
        frame). No request is dropped, duplicated or restarted. The old one is kept,
        without the requests, for :meth:`resumable`."""
        old = self.policy
        old.hand_over(self.running)
        policy.resume(now_s)
        for r in old.waiting_requests():
            old.remove(r)
            policy.enqueue(r, now_s)
        self._parked[old.name] = old
        self.policy = policy

    def resumable(self, name: str, spec: SLOPolicySpec) -> Policy | None:
        """The scheduler ``name`` as this replica last ran it, what it learned kept (a
        switch back to a fresh one relearns GMAX's cutoff and pacing: ~3% of a run for
        one 30 s excursion), configured with ``spec``; None if it never ran here."""
        policy = self._parked.pop(name, None)
        if policy is not None:
            policy.configure(spec)
        return policy

    # ---- frames -------------------------------------------------------------------------
    def frame(self, now_s: float, max_running: int) -> FrameResult:
        """A scheduling frame: refresh bounds, let the policy plan, apply its plan."""
        self.executor.sync(now_s)
        self.refiner.refresh_due(self.running)
        for r in self.refiner.requeue(self.policy.is_waiting):
            self.policy.enqueue(r, now_s)  # the policy reads a request's state when queued
        view = EngineView(
            now_s,
            max_running,
            list(self.running),
            self.speed.decode_step_s,
            self.speed.prefill_s_per_token,
            self.speed.token_s,
        )
        started = time.perf_counter()
        plan = self.policy.frame(view)
        result = FrameResult(policy_s=time.perf_counter() - started)
        self.stats.frame_seconds.add(result.policy_s)
        self.stats.frames += 1
        for retirement in plan.retire:
            result.retired += self.retire(retirement.request, retirement.reason, now_s)
        for r in plan.preempt:
            if r.phase is Phase.RUNNING and r.req.preemptible:
                self.preempt(r, now_s)
                result.preempted.append(r)
        return result

    def refine(self, r: LiveRequest, bound: int | None = None, at: int | None = None) -> None:
        """New length bound (the estimator's, or ``bound`` from a remote one, computed at
        ``at`` tokens) and expected length of ``r``."""
        self.refiner.refine(r, bound, at, waiting=self.policy.is_waiting(r))

    # ---- outcomes -----------------------------------------------------------------------
    def _record_request(
        self, r: LiveRequest, goodput: int, met: bool, now_s: float, retired: bool = False
    ) -> Outcome:
        outcome = request_outcome(r, goodput, met, now_s, retired)
        self.ledger.record(outcome)
        return outcome

    def _recorded(self, outcome: Outcome | None) -> Outcome | None:
        if outcome is not None:
            self.ledger.record(outcome)
        return outcome
