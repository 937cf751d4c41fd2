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

Every policy here is built as a profile of stages over one frame
(:class:`~jitserve.scheduling.staged.StagedPolicy`); this module is only the interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from jitserve.policy import SLOPolicySpec
from jitserve.requests import LiveRequest


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
    def peek_next(self, now_s: float, running: int) -> LiveRequest | None:
        """The waiting request to admit next, without removing it (``running``: how many
        requests run now)."""

    @abstractmethod
    def pop_next(self, now_s: float, running: int) -> LiveRequest | None:
        """Remove and return the waiting request to admit next."""

    @abstractmethod
    def remove(self, r: LiveRequest) -> None:
        """Forget a waiting request (cancelled by the client or retired)."""

    @abstractmethod
    def waiting(self) -> int:
        """How many requests wait."""

    @abstractmethod
    def waiting_requests(self) -> list[LiveRequest]:
        """The waiting requests, in the order they came to wait (the queue is theirs)."""

    @abstractmethod
    def is_waiting(self, r: LiveRequest) -> bool:
        """Is ``r`` in the queue?"""

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

    def hand_over(self, running: Iterable[LiveRequest]) -> None:
        """Another scheduler takes over (this one may be resumed later): forget what was
        kept about the ``running`` requests, which it will see again only as running."""
        return None

    def resume(self, now_s: float) -> None:
        """This scheduler takes over again after another ran: what it learned stays,
        what measured its own frames (epochs, rate clocks) starts again at ``now_s``."""
        return None

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
