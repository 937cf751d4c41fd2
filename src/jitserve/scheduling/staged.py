"""A policy built as a profile of stages: the waiting table, what the policy keeps about
requests, and the pipeline its frames run through.

:class:`StagedPolicy` is what GMAX and every baseline are: it owns the queue (a
:class:`~jitserve.scheduling.table.WaitingTable`) and the :class:`~jitserve.scheduling.frame.Kept`
memory, answers the lifecycle's calls (:class:`~jitserve.scheduling.base.Policy`), and at
every frame runs its stages (:meth:`StagedPolicy.profile`) over a fresh
:class:`~jitserve.scheduling.frame.Frame`, wrapped, when the policy has overload control,
in the two overload stages (:mod:`~jitserve.scheduling.overload`). A subclass says how an
arrival is keyed (:meth:`StagedPolicy.enqueue`) and which stages plan its frames.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable

from jitserve.policy import SLOPolicySpec
from jitserve.requests import LiveRequest
from jitserve.scheduling.base import EngineView, FramePlan, Policy
from jitserve.scheduling.frame import Frame, Kept, Pipeline, Stage
from jitserve.scheduling.overload import OverloadControl
from jitserve.scheduling.table import WaitingTable


class StagedPolicy(Policy):
    demoted_key = 0.0
    """Added to a demoted waiting request's key at once (0: the policy's own frame
    rekeys it)."""

    def __init__(self, overload: OverloadControl | None = None) -> None:
        self.queue = WaitingTable()
        self.kept = Kept(self.queue, self.demoted_key)
        self.overload = overload
        """Overload control's two stages around the profile (None: a stock policy). A
        baseline with it is named ``<name>-ac``; GMAX switches it by
        ``scheduler.mechanisms.overloadControl`` and keeps its name."""
        if overload is not None and not overload.follow_spec:
            self.name = f"{self.name}-ac"
        self.pipeline = Pipeline([])
        self.spec = SLOPolicySpec()
        """The settings in effect."""

    def configure(self, spec: SLOPolicySpec) -> None:
        """New settings: the profile is rebuilt from them (stages keep what they
        learned: a subclass builds each stage once and reuses it)."""
        self.spec = spec
        self.frame_steps = spec.scheduler.frame_steps
        own = self.profile(spec)
        stages = own if self.overload is None else self.overload.around(own, self.planner())
        self.pipeline = Pipeline(stages)
        self.pipeline.configure(spec)

    # ---- what a subclass decides -------------------------------------------------------
    @abstractmethod
    def profile(self, spec: SLOPolicySpec) -> list[Stage]:
        """The stages that plan a frame, in order, for these settings."""

    def planner(self) -> Stage | None:
        """The stage that names what the policy plans to start soon (``frame.keep``) when
        the profile does not; run before overload control's waiting limit."""
        return None

    def earned(self, r: LiveRequest, goodput_tokens: float, now_s: float) -> None:
        """``r`` finished having earned ``goodput_tokens``."""

    # ---- the lifecycle's calls ---------------------------------------------------------
    def peek_next(self, now_s: float, running: int) -> LiveRequest | None:
        return self.queue.peek()

    def pop_next(self, now_s: float, running: int) -> LiveRequest | None:
        r = self.peek_next(now_s, running)
        if r is not None:
            self.kept.take(r)
        return r

    def remove(self, r: LiveRequest) -> None:
        self.queue.remove(r)
        self.kept.forget(r)

    def waiting(self) -> int:
        return len(self.queue)

    def waiting_requests(self) -> list[LiveRequest]:
        return self.queue.in_arrival_order()

    def is_waiting(self, r: LiveRequest) -> bool:
        return r in self.queue

    def ahead_of(self, r: LiveRequest) -> int:
        return self.queue.ahead_of(r)

    def hand_over(self, running: Iterable[LiveRequest]) -> None:
        for r in running:
            self.kept.forget(r)

    def on_finish(self, r: LiveRequest, goodput_tokens: float, now_s: float) -> None:
        self.kept.forget(r)
        self.earned(r, goodput_tokens, now_s)

    def frame(self, view: EngineView) -> FramePlan:
        return self.pipeline.run(Frame(view, self.queue, self.kept))
