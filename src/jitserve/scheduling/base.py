"""The scheduling-policy interface that every engine drives.

Ownership (as in vLLM v1, request state is separate from policy):
- the *engine* (``jitserve.sim.engine`` or the sidecar's dispatcher) owns
  :class:`~jitserve.requests.LiveRequest` state, the running set, KV capacity and time;
- the *policy* owns the waiting queue and its order. The engine calls
  :meth:`Policy.enqueue` on arrival (or after a preemption), :meth:`Policy.pop_next`
  when it has room for one more request, :meth:`Policy.frame` at every scheduling frame
  boundary (every ``frame_steps`` decode steps), and :meth:`Policy.on_finish` when a
  request completes. A :class:`FramePlan` is plain data: which running requests to
  preempt and which requests to retire.
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from jitserve.policy import SLOPolicySpec
from jitserve.requests import LiveRequest, Phase


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


@dataclass(slots=True)
class FramePlan:
    preempt: list[LiveRequest] = field(default_factory=list)
    """Running requests to stop now; the engine re-enqueues them (tokens are kept)."""
    retire: list[LiveRequest] = field(default_factory=list)
    """Waiting or running requests to give up on (overload); the engine ends them."""


class Policy(ABC):
    """A scheduling policy. Subclasses decide order, preemption and retirement."""

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

    def configure(self, spec: SLOPolicySpec) -> None:
        """Apply (new) settings: at start and on hot reload of the policy file."""
        self.frame_steps = spec.scheduler.frame_steps

    def frame(self, view: EngineView) -> FramePlan:
        """Called at every frame boundary. Default: keep everything as it is."""
        return FramePlan()

    def on_finish(self, r: LiveRequest, goodput_tokens: float, now_s: float) -> None:  # noqa: B027
        """``r`` completed and earned ``goodput_tokens``."""

    def describe(self) -> dict[str, float]:
        """Live figures for metrics and status (e.g. the effective cutoff p)."""
        return {}


class RankedQueue:
    """A waiting queue ordered by a key (lower first), with lazy removal: O(log n)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, LiveRequest]] = []
        self._live: dict[LiveRequest, int] = {}
        self._seq = itertools.count()

    def push(self, r: LiveRequest, key: float) -> None:
        seq = next(self._seq)
        self._live[r] = seq
        heapq.heappush(self._heap, (key, seq, r))

    def _clean(self) -> None:
        heap = self._heap
        while heap and self._live.get(heap[0][2]) != heap[0][1]:
            heapq.heappop(heap)

    def peek(self) -> LiveRequest | None:
        self._clean()
        return self._heap[0][2] if self._heap else None

    def peek_key(self) -> float | None:
        self._clean()
        return self._heap[0][0] if self._heap else None

    def pop(self) -> LiveRequest | None:
        self._clean()
        if not self._heap:
            return None
        _, _, r = heapq.heappop(self._heap)
        del self._live[r]
        return r

    def remove(self, r: LiveRequest) -> None:
        self._live.pop(r, None)

    def members(self) -> list[LiveRequest]:
        return list(self._live)

    def rebuild(self, keyed: Iterable[tuple[float, LiveRequest]]) -> None:
        self._live.clear()
        self._heap = []
        for key, r in keyed:
            seq = next(self._seq)
            self._live[r] = seq
            self._heap.append((key, seq, r))
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, r: LiveRequest) -> bool:
        return r in self._live


class QueuedPolicy(Policy):
    """A policy whose waiting requests live in one :class:`RankedQueue`."""

    def __init__(self) -> None:
        self.queue = RankedQueue()

    def peek_next(self, now_s: float) -> LiveRequest | None:
        return self.queue.peek()

    def pop_next(self, now_s: float) -> LiveRequest | None:
        return self.queue.pop()

    def remove(self, r: LiveRequest) -> None:
        self.queue.remove(r)

    def waiting(self) -> int:
        return len(self.queue)


class KeyedPolicy(QueuedPolicy):
    """A policy defined by one sort key (lower = served first).

    ``rekey_every_frame``: keys that change with time or progress are recomputed at
    frame boundaries. ``preemptive``: at a frame, running requests whose key is worse
    than the best waiting one are swapped out (up to ``max_preemptions`` per frame)."""

    rekey_every_frame = False
    preemptive = False
    max_preemptions = 8

    @abstractmethod
    def key(self, r: LiveRequest, now_s: float) -> float:
        """Sort key; lower runs first."""

    def enqueue(self, r: LiveRequest, now_s: float) -> None:
        r.phase = Phase.WAITING
        self.queue.push(r, self.key(r, now_s))

    def frame(self, view: EngineView) -> FramePlan:
        now = view.now_s
        if self.rekey_every_frame:
            self.queue.rebuild((self.key(r, now), r) for r in self.queue.members())
        plan = FramePlan()
        if not self.preemptive or len(view.running) < view.max_running:
            return plan
        best_waiting = self.queue.peek_key()
        if best_waiting is None:
            return plan
        worst_first = sorted(view.running, key=lambda r: self.key(r, now), reverse=True)
        waiting_keys = sorted(self.key(r, now) for r in self.queue.members())[
            : self.max_preemptions
        ]
        for victim, challenger_key in zip(worst_first, waiting_keys, strict=False):
            if challenger_key < self.key(victim, now):
                plan.preempt.append(victim)
        return plan
