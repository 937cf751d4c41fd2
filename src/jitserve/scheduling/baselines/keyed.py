"""A policy defined by one sort key (lower runs first): what every baseline is.

A baseline writes its key once, over arrays (:meth:`KeyedPolicy.keys`: the requests'
features as columns, the rows themselves for a key that needs more, such as PLAS's
program service); the stages do the rest:

- :class:`Rekey` (``rekey_every_frame``): keys that change with time or progress are
  recomputed at frame boundaries;
- :class:`PreemptByKey` (``preemptive``): running requests whose key is worse than the
  best waiting ones are swapped out, up to ``max_preemptions`` per frame;
- :class:`PlanHead`, under overload control: the head of the queue that fits the free
  slots and still starts in time is what the policy plans to start.

A demoted request (overload control gave up on its SLO) is keyed after everything else.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from jitserve.policy import SLOPolicySpec
from jitserve.requests import LiveRequest
from jitserve.scheduling.base import EngineView, FramePlan
from jitserve.scheduling.frame import Frame, Stage
from jitserve.scheduling.overload import OverloadControl
from jitserve.scheduling.slack import latest_start_s
from jitserve.scheduling.staged import StagedPolicy
from jitserve.scheduling.table import Features, FloatArray, features_of, one_row

DEMOTED_KEY = 1e15
"""Added to a demoted request's sort key: best effort runs after everything with an SLO."""


@dataclass(slots=True)
class KeySpeeds:
    """The engine's measured speeds a key may use (those of the last frame)."""

    prefill_s: float = 1e-4
    decode_s: float = 0.03


@dataclass(frozen=True, slots=True)
class KeyInput:
    """What a key is computed from: the requests' features, the requests (same order),
    the clock and the measured speeds."""

    features: Features
    rows: Sequence[LiveRequest]
    now_s: float
    speeds: KeySpeeds


Keys = Callable[[KeyInput], FloatArray]


class Ranker:
    """A policy's key applied: to the waiting table at a frame, to an arrival alone, to
    the running requests a preemption compares; demoted requests after everything."""

    def __init__(self, keys: Keys, speeds: KeySpeeds, demoted_key: float) -> None:
        self.keys, self.speeds, self.demoted_key = keys, speeds, demoted_key

    def ranked(self, features: Features, rows: Sequence[LiveRequest], now_s: float) -> FloatArray:
        return self.keys(KeyInput(features, rows, now_s, self.speeds)) + np.where(
            features.demoted, self.demoted_key, 0.0
        )


class KeyedPolicy(StagedPolicy):
    rekey_every_frame = False
    preemptive = False
    max_preemptions = 8
    demoted_key = DEMOTED_KEY

    def __init__(
        self, spec: SLOPolicySpec | None = None, overload: OverloadControl | None = None
    ) -> None:
        super().__init__(overload)
        self.speeds = KeySpeeds()
        self.ranker = Ranker(self.keys, self.speeds, self.demoted_key)
        self._now_s = 0.0
        self._rekey = Rekey(self.ranker)
        self._preempt = PreemptByKey(self.ranker, self.max_preemptions)
        self.configure(spec or SLOPolicySpec())

    @abstractmethod
    def keys(self, batch: KeyInput) -> FloatArray:
        """The sort key of each request in ``batch`` (lower runs first)."""

    def profile(self, spec: SLOPolicySpec) -> list[Stage]:
        stages: list[Stage] = []
        if self.rekey_every_frame:
            stages.append(self._rekey)
        if self.preemptive:
            stages.append(self._preempt)
        return stages

    def planner(self) -> Stage | None:
        return PlanHead()

    def enqueue(self, r: LiveRequest, now_s: float) -> None:
        self._now_s = now_s
        queue = self.queue
        row, _ = self.kept.push(r, now_s)
        queue.floats("key")[row] = self.ranker.ranked(one_row(queue.features(), row), [r], now_s)[0]

    def priority_of(self, r: LiveRequest) -> float:
        features = features_of([r], self.kept.demoted)
        return -float(self.ranker.ranked(features, [r], self._now_s)[0])

    def frame(self, view: EngineView) -> FramePlan:
        self._now_s = view.now_s
        self.speeds.prefill_s = view.prefill_s_per_token
        self.speeds.decode_s = max(view.decode_step_s, 1e-3)
        return super().frame(view)


class Rekey:
    """Every waiting request's key again, from the table's columns."""

    name = "rekey"

    def __init__(self, ranker: Ranker) -> None:
        self.ranker = ranker

    def configure(self, spec: SLOPolicySpec) -> None:
        pass

    def run(self, frame: Frame) -> None:
        queue = frame.queue
        queue.set_keys(self.ranker.ranked(queue.features(), queue.rows, frame.now_s))


class PreemptByKey:
    """Swap out the running requests with the worst keys for better waiting ones, while
    every batch slot is taken (vLLM's priority scheduling)."""

    name = "preempt-by-key"

    def __init__(self, ranker: Ranker, max_preemptions: int) -> None:
        self.ranker = ranker
        self.max_preemptions = max_preemptions

    def configure(self, spec: SLOPolicySpec) -> None:
        pass

    def run(self, frame: Frame) -> None:
        running = list(frame.running)
        if len(running) < frame.view.max_running or frame.queue.peek_key() is None:
            return
        features = features_of(running, frame.kept.demoted)
        ranks = self.ranker.ranked(features, running, frame.now_s).tolist()
        worst_first = sorted(range(len(running)), key=ranks.__getitem__, reverse=True)
        waiting = np.sort(frame.queue.floats("key"))[: self.max_preemptions].tolist()
        for i, challenger in zip(worst_first, waiting, strict=False):
            if challenger < ranks[i]:
                frame.plan.preempt.append(running[i])


class PlanHead:
    """What a keyed policy plans to start: the head of the queue that fits the free batch
    slots and, the prompts queued ahead of it served first at the measured prefill rate,
    still starts in time."""

    name = "plan-head"

    def configure(self, spec: SLOPolicySpec) -> None:
        pass

    def run(self, frame: Frame) -> None:
        view = frame.view
        pf_s = view.prefill_s_per_token
        decode_s = max(view.decode_step_s, 1e-3)
        backlog_s = sum(r.prefill_target - r.prefilled for r in view.running) * pf_s
        for r in frame.queue.head(view.max_running - len(view.running)):
            if view.now_s + backlog_s <= latest_start_s(r, pf_s, decode_s):
                frame.keep.add(r)
            backlog_s += (r.prefill_target - r.prefilled) * pf_s
