"""The tuner: which scheduler would have earned the most on the traffic just seen.

Every ``period_s`` the replica's last ``warmup_s + window_s`` of work
(:class:`~jitserve.serving.traffic.TrafficRecord`: the past only, lengths not yet seen
estimated) is replayed through a twin of its engine, the simulator on the replica's
profile, once per candidate policy, each with a copy of the replica's own length
estimator, and scored on the window's arrivals by what they earned by its end (goodput
tokens, or requests that met their SLO, as the policy's objective says). The candidate
whose scores summed over the last ``memory`` comparisons beat the policy in effect's by
more than ``margin`` takes over (hysteresis: a near tie or one lucky window never
switches); there is no comparison before a whole warm-up and window of history. The
switch itself (:class:`AutoScheduler`) is the lifecycle's: the new policy takes the
waiting and running requests as they are. docs/tuning.md says why each of these is so.
"""

from __future__ import annotations

import copy
import math
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from jitserve.goodput import GoodputLedger, Outcome
from jitserve.policy import Objective, SLOPolicySpec
from jitserve.requests import Workitem
from jitserve.scheduling.estimators import LengthEstimator, UniformStageShare
from jitserve.scheduling.registry import make_policy, scheduler_names
from jitserve.serving.traffic import TrafficRecord
from jitserve.sim.engine import Engine
from jitserve.sim.latency import Profile

AUTO = "auto"
DEFAULT_CANDIDATES = ("gmax", "fcfs-ac", "sarathi-ac", "edf-ac", "lsf-ac", "sjf-ac", "plas-ac",
                      "slidingserve-ac")
"""GMAX and every baseline with the same overload control: what the matrix compares."""


@dataclass(frozen=True)
class TunerSettings:
    candidates: tuple[str, ...] = DEFAULT_CANDIDATES
    """The first is in effect until the first comparison."""
    period_s: float = 30.0
    window_s: float = 60.0
    margin: float = 0.05
    """A candidate takes over only when it earns more than (1 + margin) x the policy in
    effect on the same window."""
    min_items: int = 20
    """Fewer work items in a window: no comparison (too little to tell policies apart)."""
    warmup_s: float = 30.0
    """Each replay starts this long before the window, its work scored for nothing: the
    backlog each candidate would carry into the window is its own (a replay from an
    empty engine shows no overload, where policies differ most)."""
    memory: int = 3
    """Comparisons whose scores are summed for a decision: one window's luck does not
    switch (a regime change shows in every window after it)."""

    def __post_init__(self) -> None:
        known = set(scheduler_names())
        unknown = [c for c in self.candidates if c not in known]
        if not self.candidates or unknown:
            raise ValueError(f"auto candidates must be scheduler names, got {unknown or '[]'}; "
                             f"known: {', '.join(sorted(known))}")
        if not (self.period_s > 0 and self.window_s > 0 and self.margin >= 0
                and self.memory >= 1 and self.warmup_s >= 0):
            raise ValueError("auto period and window must be > 0, the margin and warm-up "
                             ">= 0 and the memory >= 1")


@dataclass(frozen=True)
class Trial:
    policy: str
    goodput_tokens: float
    met: int
    items: int


@dataclass(frozen=True)
class Comparison:
    """One period's table: every candidate on the same window (plain data: the
    explain endpoint's and the bench row's)."""

    at_s: float
    in_effect: str
    choice: str
    trials: tuple[Trial, ...]
    evidence: dict[str, float]
    """Each candidate's score summed over the last ``memory`` comparisons (this one's
    included): what the choice was made on."""
    cpu_s: float


class Tuner:
    def __init__(self, spec: SLOPolicySpec, profile: Profile, settings: TunerSettings,
                 seed: int = 0) -> None:
        self.spec, self.profile, self.settings, self.seed = spec, profile, settings, seed
        self._recent: deque[dict[str, float]] = deque(maxlen=settings.memory)

    def score(self, trial: Trial) -> float:
        requests = self.spec.objective is Objective.REQUESTS
        return float(trial.met) if requests else trial.goodput_tokens

    def replay(self, name: str, items: list[Workitem], estimator: LengthEstimator) -> Trial:
        """``items`` (the warm-up, then the window) through a twin of the engine scheduled
        by ``name``, until the end of the window, scoring the window's arrivals: work left
        then earns nothing (after a window the engine serves the next one's arrivals too,
        so a drain would credit what overload does not give)."""
        scheduler, settings = self.spec.scheduler, self.settings
        ledger = _ArrivedSince(settings.warmup_s)
        twin = Engine(self.profile, make_policy(self.spec, self.seed, name),
                      copy.deepcopy(estimator),
                      UniformStageShare(), ledger=ledger, refine_every=scheduler.refine_every,
                      budget_rule=scheduler.budget_rule,
                      batch_constructor=scheduler.batch_constructor)
        twin.run(items, until_s=settings.warmup_s + settings.window_s)
        return Trial(name, float(ledger.overall.goodput_tokens), ledger.overall.met, len(items))

    def compare(self, items: list[Workitem], in_effect: str, estimator: LengthEstimator,
                now_s: float) -> Comparison:
        started = time.process_time()
        trials = tuple(self.replay(name, items, estimator) for name in self.settings.candidates)
        self._recent.append({t.policy: self.score(t) for t in trials})
        evidence = {t.policy: sum(s[t.policy] for s in self._recent) for t in trials}
        best = max(evidence, key=lambda name: evidence[name])
        current = evidence.get(in_effect, -math.inf)
        choice = best if evidence[best] > (1 + self.settings.margin) * current else in_effect
        return Comparison(now_s, in_effect, choice, trials, evidence,
                          time.process_time() - started)


class _ArrivedSince(GoodputLedger):
    """A ledger of the outcomes of what arrived at ``since_s`` or later."""

    def __init__(self, since_s: float) -> None:
        super().__init__()
        self.since_s = since_s

    def record(self, o: Outcome) -> None:
        if o.arrival_s is None or o.arrival_s >= self.since_s:
            super().record(o)


@dataclass
class AutoScheduler:
    """A :class:`Tuner` beside one simulated engine, seeing only its past: every period
    the engine's record is compared and the winner switched in (the simulator's side of
    ``scheduler.policy: auto``; ``jitserve bench --policies auto``)."""

    engine: Engine
    tuner: Tuner
    comparisons: list[Comparison] = field(default_factory=list)
    switches: list[tuple[float, str]] = field(default_factory=list)
    """(when, to which policy), the first entry the start: the first candidate."""

    def __post_init__(self) -> None:
        settings = self.tuner.settings
        self.switches.append((0.0, settings.candidates[0]))
        self.record = TrafficRecord(settings.warmup_s + settings.window_s)
        self.engine.lifecycle.observer = self.record
        self._next_s = settings.period_s

    @property
    def in_effect(self) -> str:
        return self.switches[-1][1]

    def items(self, workload: Iterable[Workitem]) -> Iterator[Workitem]:
        """``workload`` as the engine's driver takes it, the tuner run at the first
        arrival after each period boundary."""
        for item in workload:
            if self._next_s <= item.arrival_s:
                # as of the engine's time (the last arrival's): advancing it to the boundary
                # would cut a decode stretch, and the run would differ from the fixed
                # policy's even when the tuner never switches
                self.tick(self.engine.now)
                while self._next_s <= item.arrival_s:
                    self._next_s += self.tuner.settings.period_s
            yield item

    def tick(self, now_s: float) -> None:
        settings = self.tuner.settings
        span_s = settings.warmup_s + settings.window_s
        if now_s < span_s:
            # a shorter history is a few tens of requests scored over seconds: the first
            # version switched on one or two of them and held the wrong policy for 2 minutes
            return
        window = self.record.window(now_s - span_s, now_s)
        if len(window) < settings.min_items:
            return
        comparison = self.tuner.compare(window, self.in_effect,
                                        self.engine.lifecycle.estimator, now_s)
        self.comparisons.append(comparison)
        if comparison.choice != self.in_effect:
            self.switches.append((now_s, comparison.choice))
            self.engine.switch_policy(make_policy(self.tuner.spec, self.tuner.seed,
                                                  comparison.choice))

    def summary(self) -> dict[str, object]:
        """What the bench row says of the run: the switches, the time each policy was in
        effect until ``end_s``, the tuner's CPU time."""
        end_s = self.engine.now
        held: dict[str, float] = {}
        for (at, name), (until, _) in zip(self.switches, [*self.switches[1:], (end_s, "")],
                                          strict=True):
            held[name] = held.get(name, 0.0) + max(until - at, 0.0)
        return {
            "switches": [[round(at, 3), name] for at, name in self.switches],
            "seconds_in_effect": {k: round(v, 3) for k, v in sorted(held.items())},
            "comparisons": len(self.comparisons),
            "tuner_cpu_s": round(sum(c.cpu_s for c in self.comparisons), 3),
        }
