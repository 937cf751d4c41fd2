"""The scheduling-policy interface that the request lifecycle drives.

Ownership (as in vLLM v1, request state is separate from policy):
- the *lifecycle* (:mod:`jitserve.serving`) owns :class:`~jitserve.requests.LiveRequest`
  state (phase, tokens, bounds); the engines driving it (the simulator, the sidecar) own
  time, the running set and the backend;
- the *policy* owns the waiting queue, its order and every value it computes to decide
  (priority, frames waited, demotion), kept in its own maps, never written into requests.
  The lifecycle calls :meth:`Policy.enqueue` on arrival (or after a preemption),
  :meth:`Policy.pop_next` when there is room for one more request, :meth:`Policy.frame`
  at every scheduling frame boundary, and :meth:`Policy.on_finish` when a request leaves.
  A :class:`FramePlan` is plain data: which running requests to preempt and which
  requests to retire, each with its reason.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

import numpy as np

from jitserve.policy import SLOPolicySpec
from jitserve.requests import LiveRequest
from jitserve.scheduling.slack import latest_start_s
from jitserve.scheduling.table import Features, FloatArray, WaitingTable

if TYPE_CHECKING:
    from jitserve.scheduling.overload import OverloadStage


@dataclass(slots=True)
class EngineView:
    """What a policy may see of the engine when it plans a frame."""

    now_s: float
    max_running: int
    """Batch size B: how many requests can run at once."""
    running: Sequence[LiveRequest]
    decode_step_s: float
    """Measured time of one decode step at the current load (v_token)."""
    prefill_s_per_token: float
    """Measured wall time per prompt token at the current load (iteration time / prompt
    tokens in it): how fast queued prompts get through."""
    token_s: float = 0.0
    """Measured engine seconds per batched token (iteration time / tokens in it): the
    marginal cost of one more prompt or output token when the token budget binds."""


class RetireReason(StrEnum):
    """Why overload control gave up on a request (a metric label and an API error code)."""

    MAX_WAITING = "max_waiting"
    """Never started within ``admission.maxWaitingSeconds`` and not planned to be."""
    UNREACHABLE = "unreachable"
    """Its deadline cannot be met even if it ran alone at full speed from now."""
    WOULD_START_LATE = "would_start_late"
    """At the door: its first token, forecast with the forecast's observed error
    (:mod:`~jitserve.serving.forecast`), would come after its TTFT target."""


@dataclass(frozen=True, slots=True)
class Retirement:
    request: LiveRequest
    reason: RetireReason


@dataclass(slots=True)
class FramePlan:
    preempt: list[LiveRequest] = field(default_factory=list)
    """Running requests to stop now; the lifecycle re-enqueues them (tokens are kept)."""
    retire: list[Retirement] = field(default_factory=list)
    """Waiting or running requests to give up on (overload); the lifecycle ends them."""

    def retired(self) -> set[LiveRequest]:
        return {r.request for r in self.retire}


class Policy(ABC):
    """What the lifecycle needs of a scheduling policy: a waiting queue it fills and
    drains, a plan at every frame, and word when a request leaves."""

    name: str = "policy"
    chunked_prefill: bool = True
    """Engine hint: chunked prefill with decode-first batching (Sarathi-style) or
    whole-prompt, prefill-first batching (vLLM v0 style)."""
    frame_steps: int = 50

    @abstractmethod
    def enqueue(self, r: LiveRequest, now_s: float) -> None:
        """``r`` is waiting (new arrival or preempted)."""

    @abstractmethod
    def peek_next(self, now_s: float) -> LiveRequest | None:
        """The waiting request to admit next, without removing it."""

    @abstractmethod
    def pop_next(self, now_s: float) -> LiveRequest | None:
        """Remove and return the waiting request to admit next."""

    @abstractmethod
    def remove(self, r: LiveRequest) -> None:
        """Forget a waiting request (cancelled by the client or retired)."""

    @abstractmethod
    def waiting(self) -> int:
        """How many requests wait."""

    def ahead_of(self, r: LiveRequest) -> int:
        """How many waiting requests the policy would start before ``r`` (default: all
        the others)."""
        return max(self.waiting() - 1, 0)

    @abstractmethod
    def configure(self, spec: SLOPolicySpec) -> None:
        """Apply (new) settings: at start and on hot reload of the policy file. What the
        policy learned (e.g. an auto-tuned cutoff) is kept."""

    @abstractmethod
    def frame(self, view: EngineView) -> FramePlan:
        """Called at every frame boundary: what to preempt and what to retire."""

    @abstractmethod
    def on_finish(self, r: LiveRequest, goodput_tokens: float, now_s: float) -> None:
        """``r`` left the engine (finished, retired or cancelled) having earned
        ``goodput_tokens``; the policy forgets what it kept about ``r``."""

    def priority_of(self, r: LiveRequest) -> float:
        """The policy's current rank value of ``r`` (higher = served first): metrics and
        the debug view show it."""
        return 0.0

    def admit_priority(self) -> float:
        """The lowest priority a request arriving now would start at while every batch
        slot is taken (a replica report's marginal priority); 0: no bar (a policy
        without one, or a free slot)."""
        return 0.0

    def describe(self) -> dict[str, float]:
        """Live figures for metrics and status (e.g. the effective cutoff p, the fairness
        weight f in effect: absent, 0)."""
        return {}


class QueuedPolicy(Policy):
    """A policy whose waiting requests live in one
    :class:`~jitserve.scheduling.table.WaitingTable`, whose frame runs inside its
    overload stage when it has one (:mod:`~jitserve.scheduling.overload`; ``-ac``
    baselines and GMAX), and which says what it plans to start (:meth:`planned`) and
    serves demoted requests last (:meth:`demote`) for that stage."""

    def __init__(self) -> None:
        self.queue = WaitingTable()
        self.overload: OverloadStage | None = None

    def configure(self, spec: SLOPolicySpec) -> None:
        self.frame_steps = spec.scheduler.frame_steps
        if self.overload is not None:
            self.overload.configure(spec)

    def peek_next(self, now_s: float) -> LiveRequest | None:
        return self.queue.peek()

    def pop_next(self, now_s: float) -> LiveRequest | None:
        return self.queue.pop()

    def remove(self, r: LiveRequest) -> None:
        self.queue.remove(r)
        if self.overload is not None:
            self.overload.forget(r)
        self.forget(r)

    def waiting(self) -> int:
        return len(self.queue)

    def ahead_of(self, r: LiveRequest) -> int:
        return self.queue.ahead_of(r)

    def on_finish(self, r: LiveRequest, goodput_tokens: float, now_s: float) -> None:
        if self.overload is not None:
            self.overload.forget(r)
        self.forget(r)
        self.earned(r, goodput_tokens, now_s)

    def frame(self, view: EngineView) -> FramePlan:
        if self.overload is None:
            return self.plan(view)
        return self.overload.frame(self, view)

    # ---- what subclasses decide ---------------------------------------------------------
    def plan(self, view: EngineView) -> FramePlan:
        """The policy's own plan for the frame. Default: keep everything as it is."""
        return FramePlan()

    def planned(self, view: EngineView) -> Collection[LiveRequest]:
        """The head of the queue that fits the free batch slots and, prompts queued ahead
        of it served first at the measured prefill rate, still starts in time: overload
        control keeps them even past the waiting limit."""
        pf_s = view.prefill_s_per_token
        decode_s = max(view.decode_step_s, 1e-3)
        backlog_s = sum(r.prefill_target - r.prefilled for r in view.running) * pf_s
        out = []
        for r in self.queue.head(view.max_running - len(view.running)):
            if view.now_s + backlog_s <= latest_start_s(r, pf_s, decode_s):
                out.append(r)
            backlog_s += (r.prefill_target - r.prefilled) * pf_s
        return out

    def demote(self, r: LiveRequest) -> None:
        """Overload control gave up on ``r``'s SLO but keeps it (``overloadAction:
        demote``): serve it as best effort, after everything that still has an SLO."""

    def forget(self, r: LiveRequest) -> None:
        """``r`` left (the queue or the engine): drop what the policy kept about it."""

    def earned(self, r: LiveRequest, goodput_tokens: float, now_s: float) -> None:
        """``r`` finished having earned ``goodput_tokens``."""


DEMOTED_KEY = 1e15
"""Added to a demoted request's sort key: best effort runs after everything with an SLO."""


class KeyedPolicy(QueuedPolicy):
    """A policy defined by one sort key (lower = served first): a baseline is its key,
    given per request (:meth:`key`) and, where it is a function of the waiting table's
    columns, over the whole queue at once (:meth:`keys`).

    ``rekey_every_frame``: keys that change with time or progress are recomputed at
    frame boundaries. ``preemptive``: at a frame, running requests whose key is worse
    than the best waiting one are swapped out (up to ``max_preemptions`` per frame)."""

    rekey_every_frame = False
    preemptive = False
    max_preemptions = 8

    def __init__(self) -> None:
        super().__init__()
        self._demoted: set[LiveRequest] = set()
        self._now_s = 0.0

    @abstractmethod
    def key(self, r: LiveRequest, now_s: float) -> float:
        """Sort key; lower runs first."""

    def keys(self, features: Features, now_s: float) -> FloatArray | None:
        """:meth:`key` of every waiting request from its features (None: not a function
        of them; :meth:`key` is asked per request)."""
        return None

    def rank(self, r: LiveRequest, now_s: float) -> float:
        """The key, after everything else once overload control demoted ``r``."""
        return self.key(r, now_s) + (DEMOTED_KEY if r in self._demoted else 0.0)

    def enqueue(self, r: LiveRequest, now_s: float) -> None:
        self._now_s = now_s
        self.queue.push(r, self.rank(r, now_s), now_s)

    def priority_of(self, r: LiveRequest) -> float:
        return -self.rank(r, self._now_s)

    def demote(self, r: LiveRequest) -> None:
        self._demoted.add(r)
        if r in self.queue:
            self.queue.push(r, self.rank(r, self._now_s))

    def forget(self, r: LiveRequest) -> None:
        self._demoted.discard(r)

    def _rekey(self, now_s: float) -> None:
        queue = self.queue
        keys = self.keys(queue.features(), now_s)
        if keys is None:
            queue.set_keys([self.rank(r, now_s) for r in queue.rows])
            return
        rows = [queue.row_of(r) for r in self._demoted]
        demoted = [i for i in rows if i is not None]
        if demoted:
            keys = keys.copy()
            keys[demoted] += DEMOTED_KEY
        queue.set_keys(keys)

    def plan(self, view: EngineView) -> FramePlan:
        now = self._now_s = view.now_s
        if self.rekey_every_frame:
            self._rekey(now)
        plan = FramePlan()
        if not self.preemptive or len(view.running) < view.max_running:
            return plan
        best_waiting = self.queue.peek_key()
        if best_waiting is None:
            return plan
        worst_first = sorted(view.running, key=lambda r: self.rank(r, now), reverse=True)
        keys = (
            self.queue.floats("key")
            if self.rekey_every_frame
            else np.array([self.rank(r, now) for r in self.queue.rows])
        )
        waiting_keys = np.sort(keys)[: self.max_preemptions].tolist()
        for victim, challenger_key in zip(worst_first, waiting_keys, strict=False):
            if challenger_key < self.rank(victim, now):
                plan.preempt.append(victim)
        return plan
