"""The tuner: which scheduler would have earned the most on the traffic just seen.

Every ``periodSeconds`` the replica's last ``warmupSeconds + windowSeconds`` of work
(:class:`~jitserve.serving.traffic.TrafficRecord`: the past only, lengths not yet seen
estimated) is replayed through a twin of its engine, the simulator on the replica's
profile, once per candidate policy, each with a copy of the replica's own length
estimator, and scored on the window's arrivals by what they earned by its end (goodput
tokens, or requests that met their SLO, as the policy's objective says). The candidate
whose scores summed over the last ``memory`` comparisons beat the policy in effect's by
more than ``margin``, and that beat it in each of those ``memory`` windows, takes over
(hysteresis: a near tie, one lucky window or one lucky burst never switches); there is no
comparison before a whole warm-up and window of history. The
settings are ``SLOPolicy``'s ``scheduler.auto``. The switch itself is the lifecycle's:
the new policy takes the waiting and running requests as they are; the simulator's
driver is :class:`AutoScheduler`, the sidecar's :mod:`jitserve.sidecar.tuning` (which
runs :func:`replay_all` in a process of its own). docs/tuning.md says why each of these
is so.
"""

from __future__ import annotations

import copy
import math
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from jitserve.goodput import GoodputLedger, Outcome
from jitserve.policy import AUTO, AutoSettings, Objective, SLOPolicySpec
from jitserve.requests import Workitem
from jitserve.scheduling.estimators import LengthEstimator, UniformStageShare
from jitserve.scheduling.registry import make_policy, scheduler_names
from jitserve.serving.traffic import TrafficRecord
from jitserve.sim.engine import Engine
from jitserve.sim.latency import Profile

__all__ = ["AUTO", "AutoScheduler", "Comparison", "Trial", "Tuner", "check_candidates",
           "replay_all", "with_auto"]


def check_candidates(auto: AutoSettings) -> None:
    """ValueError naming the candidates no scheduler has."""
    known = scheduler_names()
    unknown = [name for name in auto.candidates if name not in known]
    if unknown:
        raise ValueError(f"scheduler.auto.candidates: unknown {', '.join(map(repr, unknown))}; "
                         f"known: {', '.join(known)}")


def with_auto(spec: SLOPolicySpec, **changes: object) -> SLOPolicySpec:
    """``spec`` with ``scheduler.auto``'s fields changed (snake_case names), validated as
    the sidecar validates its policy file (ValueError naming the field)."""
    auto = AutoSettings.model_validate({**spec.scheduler.auto.model_dump(), **changes})
    check_candidates(auto)
    return spec.with_scheduler(auto=auto)


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


def replay(spec: SLOPolicySpec, profile: Profile, name: str, items: Sequence[Workitem],
           estimator: LengthEstimator, seed: int = 0) -> Trial:
    """``items`` (the warm-up, then the window) through a twin of the engine scheduled
    by ``name``, until the end of the window, scoring the window's arrivals: work left
    then earns nothing (after a window the engine serves the next one's arrivals too, so
    a drain would credit what overload does not give)."""
    scheduler, auto = spec.scheduler, spec.scheduler.auto
    ledger = _ArrivedSince(auto.warmup_seconds)
    twin = Engine(profile, make_policy(spec, seed, name), copy.deepcopy(estimator),
                  UniformStageShare(), ledger=ledger, refine_every=scheduler.refine_every,
                  budget_rule=scheduler.budget_rule,
                  batch_constructor=scheduler.batch_constructor)
    twin.run(items, until_s=auto.warmup_seconds + auto.window_seconds)
    return Trial(name, float(ledger.overall.goodput_tokens), ledger.overall.met, len(items))


def replay_all(spec: SLOPolicySpec, profile: Profile, items: Sequence[Workitem],
               estimator: LengthEstimator, seed: int = 0) -> tuple[tuple[Trial, ...], float]:
    """Every candidate of ``spec.scheduler.auto`` on ``items``, and the CPU seconds it
    took (a module-level function: the sidecar runs it in a process of its own)."""
    started = time.process_time()
    trials = tuple(replay(spec, profile, name, items, estimator, seed)
                   for name in spec.scheduler.auto.candidates)
    return trials, time.process_time() - started


class Tuner:
    """The decisions over the comparisons, from ``spec.scheduler.auto``: when a window
    is due, and which candidate its trials (with the last ``memory`` windows') elect."""

    def __init__(self, spec: SLOPolicySpec, profile: Profile, seed: int = 0) -> None:
        check_candidates(spec.scheduler.auto)
        self.spec, self.profile, self.seed = spec, profile, seed
        self._recent: deque[dict[str, float]] = deque(maxlen=self.settings.memory)

    @property
    def settings(self) -> AutoSettings:
        return self.spec.scheduler.auto

    @property
    def span_s(self) -> float:
        return self.settings.warmup_seconds + self.settings.window_seconds

    def record(self) -> TrafficRecord:
        """A record that keeps what one comparison replays."""
        return TrafficRecord(self.span_s)

    def due(self, record: TrafficRecord, since_s: float, now_s: float) -> list[Workitem] | None:
        """The warm-up and window to replay at ``now_s``, or None: less than a whole
        span of history since ``since_s`` (a shorter one is a few tens of requests
        scored over seconds: the first version switched on one or two of them and held
        the wrong policy for 2 minutes), or fewer than ``min_requests`` in it."""
        if now_s - since_s < self.span_s:
            return None
        window = record.window(now_s - self.span_s, now_s)
        return window if len(window) >= self.settings.min_requests else None

    def score(self, trial: Trial) -> float:
        requests = self.spec.objective is Objective.REQUESTS
        return float(trial.met) if requests else trial.goodput_tokens

    def decide(self, trials: tuple[Trial, ...], in_effect: str, now_s: float,
               cpu_s: float) -> Comparison:
        self._recent.append({t.policy: self.score(t) for t in trials})
        evidence = {t.policy: sum(s[t.policy] for s in self._recent) for t in trials}
        best = max(evidence, key=lambda name: evidence[name])
        current = evidence.get(in_effect, -math.inf)
        ahead = evidence[best] > (1 + self.settings.margin) * current
        choice = best if ahead and self._every_window(best, in_effect) else in_effect
        return Comparison(now_s, in_effect, choice, trials, evidence, cpu_s)

    def _every_window(self, challenger: str, in_effect: str) -> bool:
        """Whether ``challenger`` scored above ``in_effect`` in each of the last ``memory``
        windows (a full memory of them): on azure-code's few long requests a 60 s
        window's ranking turns over from one window to the next, and a sum can be carried
        by one of them."""
        return len(self._recent) == self.settings.memory and all(
            s[challenger] > s.get(in_effect, -math.inf) for s in self._recent)

    def compare(self, items: list[Workitem], in_effect: str, estimator: LengthEstimator,
                now_s: float) -> Comparison:
        trials, cpu_s = replay_all(self.spec, self.profile, items, estimator, self.seed)
        return self.decide(trials, in_effect, now_s, cpu_s)


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
        self.switches.append((0.0, self.tuner.settings.candidates[0]))
        self.record = self.tuner.record()
        self.engine.lifecycle.observer = self.record
        self._next_s = self.tuner.settings.period_seconds

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
                    self._next_s += self.tuner.settings.period_seconds
            yield item

    def tick(self, now_s: float) -> None:
        window = self.tuner.due(self.record, 0.0, now_s)
        if window is None:
            return
        comparison = self.tuner.compare(window, self.in_effect,
                                        self.engine.lifecycle.estimator, now_s)
        self.comparisons.append(comparison)
        if comparison.choice != self.in_effect:
            self.switches.append((now_s, comparison.choice))
            spec, name = self.tuner.spec, comparison.choice
            self.engine.switch_policy(self.engine.lifecycle.resumable(name, spec)
                                      or make_policy(spec, self.tuner.seed, name))

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
