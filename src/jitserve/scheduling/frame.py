"""The frame: what a policy's stages share for one scheduling frame, and the one interface
every stage has.

A policy is a profile: a list of :class:`Stage` objects run in order over one
:class:`Frame` (llm-d's endpoint picker runs its filter, scorer and picker plugins over one
per-cycle state the same way; vLLM v1's scheduler hands back a plain-data plan, as the
frame's :class:`~jitserve.scheduling.base.FramePlan` is). A stage reads what earlier stages
wrote (scores, priorities, the group), writes its own part, and never calls the policy
back; :class:`Pipeline` runs the stages and times each one.

Ownership: the waiting requests are the rows of the policy's
:class:`~jitserve.scheduling.table.WaitingTable`; :class:`Kept` is the one owner of what a
policy remembers about a request outside the table (priority and frames waited while it
runs) and of which requests were demoted (the table's ``demoted`` column mirrors it for
the waiting ones, so arrays can read it). The running set is the lifecycle's, handed in
with the :class:`~jitserve.scheduling.base.EngineView`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from jitserve.policy import SLOPolicySpec
from jitserve.requests import LiveRequest
from jitserve.scheduling.base import EngineView, FramePlan, Retirement, RetireReason
from jitserve.scheduling.scores import Scores, Speeds
from jitserve.scheduling.table import Features, WaitingTable

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
EMPTY = np.zeros(0)


class Stage(Protocol):
    """One step of a policy's frame. ``configure`` takes the whole settings model (at
    start and on hot reload); ``run`` reads and writes the frame."""

    name: str

    def configure(self, spec: SLOPolicySpec) -> None: ...

    def run(self, frame: Frame) -> None: ...


class Kept:
    """What a policy remembers about requests outside its waiting table, and which
    requests overload control demoted (waiting or running): one owner for each."""

    def __init__(self, queue: WaitingTable, demoted_key: float = 0.0) -> None:
        self.queue = queue
        self.demoted: set[LiveRequest] = set()
        self.priority: dict[LiveRequest, float] = {}
        """A running request's priority at the last frame (or when it started)."""
        self.waited: dict[LiveRequest, int] = {}
        """Frames a running request had waited (aging resumes if it is preempted)."""
        self.demoted_key = demoted_key
        """Added to a waiting request's key when it is demoted (0: the policy rekeys)."""

    def push(self, r: LiveRequest, now_s: float) -> tuple[int, bool]:
        """Queue ``r`` and return (its row, whether it was not queued already: an arrival or
        a preempted request back, not one whose bounds were refined while it waited). What
        was kept about it while it ran goes back into the table's columns."""
        queue = self.queue
        fresh = r not in queue
        queue.push(r, 0.0, now_s)
        row = queue.row_of(r)
        assert row is not None
        if fresh:
            queue.ints("waited")[row] = self.waited.pop(r, 0)
            queue.flags("demoted")[row] = r in self.demoted
            self.priority.pop(r, None)
        return row, fresh

    def take(self, r: LiveRequest) -> None:
        """``r`` leaves the queue to run: its priority and frames waited are kept."""
        queue = self.queue
        row = queue.row_of(r)
        assert row is not None, f"{r.req.request_id} is not queued"
        self.priority[r] = float(queue.floats("priority")[row])
        self.waited[r] = int(queue.ints("waited")[row])
        queue.remove(r)

    def demote(self, r: LiveRequest) -> None:
        """Overload control gave up on ``r``'s SLO but keeps it, as best effort."""
        row = self.queue.row_of(r)
        if row is not None and not self.queue.flags("demoted")[row]:
            self.queue.flags("demoted")[row] = True
            self.queue.floats("key")[row] += self.demoted_key
        self.demoted.add(r)

    def forget(self, r: LiveRequest) -> None:
        self.demoted.discard(r)
        self.priority.pop(r, None)
        self.waited.pop(r, None)


@dataclass(slots=True)
class Frame:
    """One frame's shared state. Rows of the arrays are the live requests: the running
    ones first (``running``, in order), then the waiting table's rows."""

    view: EngineView
    """The engine as the frame sees it; overload control takes lost running requests
    out of ``view.running`` before the policy's stages plan."""
    queue: WaitingTable
    kept: Kept
    plan: FramePlan = field(default_factory=FramePlan)
    keep: set[LiveRequest] = field(default_factory=set)
    """Waiting requests the policy plans to start soon: overload control keeps them."""
    speeds: Speeds | None = None
    live: Features | None = None
    scores: Scores | None = None
    priority: FloatArray = field(default_factory=lambda: EMPTY)
    hopeless: BoolArray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    chosen: BoolArray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    """The group: the live requests to run over the next frame."""

    @property
    def now_s(self) -> float:
        return self.view.now_s

    @property
    def running(self) -> Sequence[LiveRequest]:
        return self.view.running

    @property
    def first_waiting(self) -> int:
        """The row of the first waiting request (= how many run)."""
        return len(self.view.running)

    def give_up(self, r: LiveRequest, reason: RetireReason, demote: bool) -> None:
        """Overload control's verdict on ``r``: demoted (kept as best effort) or retired
        (out of the queue now, so later stages plan without it)."""
        if demote:
            self.kept.demote(r)
            return
        if r in self.queue:
            self.queue.remove(r)
            self.kept.forget(r)
        self.plan.retire.append(Retirement(r, reason))

    def finished(self) -> FramePlan:
        """The plan: nothing retired is also preempted."""
        gone = self.plan.retired()
        if gone:
            self.plan.preempt = [r for r in self.plan.preempt if r not in gone]
        return self.plan


class Pipeline:
    """Runs a profile's stages in order over a frame and times each one."""

    def __init__(self, stages: list[Stage]) -> None:
        self.stages = stages
        self.seconds: dict[str, float] = {s.name: 0.0 for s in stages}
        """Wall seconds spent in each stage, summed over the frames."""

    def configure(self, spec: SLOPolicySpec) -> None:
        for stage in self.stages:
            stage.configure(spec)

    def run(self, frame: Frame) -> FramePlan:
        clock = time.perf_counter
        for stage in self.stages:
            started = clock()
            stage.run(frame)
            self.seconds[stage.name] += clock() - started
        return frame.finished()


def no_bar(bar: float) -> float:
    """``bar`` as an admission bar: 0 when there is none (not finite or not positive)."""
    return bar if math.isfinite(bar) and bar > 0 else 0.0
