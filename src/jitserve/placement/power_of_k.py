"""Power-of-K placement (JITServe paper, "Supporting Multiple Models"): GMAX's priority,
computed per replica, decides where a request goes (owner: placement; pure).

The paper gives each request K dummy copies on K sampled replicas, each copy with a
*replica-specific* priority, and lets GMAX run over the enlarged set: the first replica
that schedules a copy wins. A gateway places at arrival, in one hop, from reports, so
this is the arrival-time form of it: for each of the K sampled replicas
(:class:`~jitserve.placement.plugins.SampleK`), score the request with GMAX's own
scorer (:func:`jitserve.scheduling.gmax.priorities.score_features`) at *that* replica's
measured speeds (decode step, prefill and per-token cost from its report) and start
delay (its queue: prompts still to prefill, and a wait for a batch slot when its
priority would not clear the replica's admit priority), then compare that priority with
the replica's ``admit_priority`` (the marginal priority it would start now, raised by
what this placer sent it since the report). Scorers: :class:`GmaxAdmit` (would the
replica start it now), :class:`GmaxValue` (where is it worth most) and a load scorer;
the picker takes the highest weighted sum. See docs/placement.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from jitserve.placement.base import Ask, Pick, Refusal, ReplicaReport
from jitserve.placement.pipeline import MaxScore, Pipeline
from jitserve.placement.plugins import (
    Allowed,
    LeastTime,
    LeastTokens,
    NotShedding,
    Ready,
    SampleK,
)
from jitserve.placement.simple import SentSinceReport
from jitserve.policy import SLOPolicySpec
from jitserve.scheduling.estimators.remaining import normal_quantile
from jitserve.scheduling.gmax.priorities import MIN_TIME_S, ScoreAt, score_features
from jitserve.scheduling.scores import RowSpeeds, Speeds
from jitserve.scheduling.table import Features
from jitserve.slo import LatencySLO

DEFAULT_WEIGHTS = {"gmax-admit": 1.0, "gmax-value": 0.0, "least-tokens": 0.0, "least-time": 1.0}
"""Tuned on validation seeds 1-3 (docs/benchmarks.md, "Placement across replicas")."""


def ask_features(ask: Ask) -> Features:
    """One waiting request's features, as GMAX's waiting table would hold them. A whole
    compound program (the simulator places programs) is scored as one deadline request
    over all its calls; a compound call as a deadline request to the program's deadline."""
    slo = ask.slo
    latency = isinstance(slo, LatencySLO)
    if isinstance(slo, LatencySLO):
        deadline, due0, tbt = math.inf, ask.arrival_s + slo.ttft_s, slo.tbt_s
    else:
        deadline, due0, tbt = ask.arrival_s + slo.deadline_s, 0.0, 0.0

    def f(x: float) -> np.ndarray:
        return np.array([x], dtype=np.float64)

    def b(x: bool) -> np.ndarray:
        return np.array([x], dtype=bool)

    def i(x: int) -> np.ndarray:
        return np.array([x], dtype=np.int64)

    return Features(
        arrival=f(ask.arrival_s), prompt=f(ask.prompt_tokens), generated=f(0.0),
        remaining=f(max(ask.output_bound, 1)), typical=f(max(ask.typical_output, 1)),
        prefill_left=f(ask.prompt_tokens), deadline=f(deadline), whole_deadline=f(deadline),
        due0=f(due0), tbt=f(tbt), sunk=f(1.0), is_latency=b(latency), first_token=b(False),
        started=b(False), demoted=b(False), program=i(-1), tenant=i(0), waited=i(0),
    )  # fmt: skip


class ReplicaPriorities:
    """The request's GMAX priority on each replica and each replica's admit bar, for the
    request being placed (computed once per replica, read by both GMAX scorers)."""

    def __init__(self, spec: SLOPolicySpec | None = None) -> None:
        self.use(spec or SLOPolicySpec())
        self.sent_priorities: dict[str, list[float]] = {}
        """Priorities of what this placer sent each replica since its report."""
        self._ask: str | None = None
        self._features: Features | None = None
        self._memo: dict[str, tuple[float, float, bool, float]] = {}

    def use(self, spec: SLOPolicySpec) -> None:
        """Score with ``spec``'s GMAX settings from now on (a reloaded policy file)."""
        self.spec = spec
        self.z_q = normal_quantile(spec.scheduler.length_quantile)

    def of(
        self, ask: Ask, report: ReplicaReport, now_s: float, sent: SentSinceReport
    ) -> tuple[float, float, bool, float]:
        """(priority on this replica, its admit priority, would it start the request now,
        its priority there at a cost comparable across replicas)."""
        if ask.request_id != self._ask or report.replica not in self._memo:
            self.prepare(ask, [report], now_s, sent)
        return self._memo[report.replica]

    def prepare(
        self, ask: Ask, reports: list[ReplicaReport], now_s: float, sent: SentSinceReport
    ) -> None:
        """Score the request on every one of ``reports`` in one vectorised call of GMAX's
        scorer (3 rows per replica: started now, after the queue, at comparable cost)."""
        if ask.request_id != self._ask:
            self._ask, self._memo, self._features = ask.request_id, {}, ask_features(ask)
        todo = [r for r in reports if r.replica not in self._memo]
        if not todo:
            return
        assert self._features is not None
        k = len(todo)
        n_sent = np.array([sent.requests.get(r.replica, 0) for r in todo], dtype=np.float64)
        outstanding = np.array([r.outstanding_requests for r in todo], dtype=np.float64)
        batch = np.array([max(r.max_running, 1) for r in todo], dtype=np.float64)
        decode_s = np.array([max(r.decode_s, MIN_TIME_S) for r in todo])
        prefill_s = np.array([r.prefill_s for r in todo])
        live = outstanding + n_sent
        prefill_wait = prefill_s * np.array(
            [r.prefill_tokens + sent.prompts.get(r.replica, 0) for r in todo], dtype=np.float64
        )
        # started now, it waits only for the prompts already running (the queue's share
        # of the backlog is behind it); otherwise for all of them and a batch slot: its
        # place in line x the mean tokens left per request x the step time / B
        running = np.array([r.running for r in todo], dtype=np.float64)
        delay_now = prefill_wait * running / np.maximum(outstanding, 1)
        tokens_left = np.array(
            [r.outstanding_tokens + sent.tokens.get(r.replica, 0) for r in todo],
            dtype=np.float64,
        ) / np.maximum(live, 1)
        slot_wait = np.maximum(live + 1 - batch, 0) * tokens_left * decode_s / batch
        delay_queued = prefill_wait + slot_wait
        bind = live + 1 > batch
        rows = RowSpeeds(
            now_s=now_s + np.concatenate([delay_now, delay_queued, delay_now, delay_queued]),
            decode_s=np.tile(decode_s, 4), prefill_s=np.tile(prefill_s, 4),
            # the last two: the cost in the replica's own step time, comparable across
            # replicas (the measured cost per token falls as a batch fills: a busy
            # replica would look cheap)
            token_s=np.concatenate([np.array([r.token_s for r in todo] * 2), decode_s / batch,
                                    decode_s / batch]),
            batch=np.tile(batch, 4),
            slots_bind=np.concatenate([bind, bind, np.zeros(2 * k, dtype=bool)]),
        )  # fmt: skip
        features = Features(
            *(np.repeat(getattr(self._features, name), 4 * k) for name in Features.__slots__)
        )
        at = ScoreAt(now_s, Speeds(z_q=self.z_q), self.spec, rows=rows)
        p = np.maximum(score_features(features, at).priority, 0.0)
        bars = [self.admit_bar(r, int(n)) for r, n in zip(todo, n_sent.tolist(), strict=True)]
        for i, (r, bar) in enumerate(zip(todo, bars, strict=True)):
            now_p = float(p[i])
            admitted = now_p > 0 and now_p >= bar
            j = i if admitted else k + i
            self._memo[r.replica] = (float(p[j]), bar, admitted, float(p[2 * k + j]))

    def admit_bar(self, report: ReplicaReport, sent_requests: int) -> float:
        """The report's admit priority; once what was sent since fills the free slots it
        reported, at least the lowest priority sent there (those now hold the slots)."""
        bar = report.admit_priority
        mine = self.sent_priorities.get(report.replica)
        if mine and sent_requests >= report.max_running - report.outstanding_requests:
            bar = max(bar, min(mine))
        return bar

    def placed(self, ask: Ask, replica: str) -> None:
        got = self._memo.get(replica) if ask.request_id == self._ask else None
        if got is not None:
            self.sent_priorities.setdefault(replica, []).append(got[0])

    def reported(self, replica: str) -> None:
        self.sent_priorities.pop(replica, None)

    def forget(self) -> None:
        """Drop the scores of the last request (kept until then for :meth:`placed`)."""
        self._ask, self._memo = None, {}


class GmaxAdmit:
    """1 where the replica would start the request now (its priority there clears the
    admit priority); else the fraction of the bar it reaches."""

    name = "gmax-admit"

    def __init__(self, priorities: ReplicaPriorities) -> None:
        self.priorities = priorities

    def score(
        self, ask: Ask, reports: list[ReplicaReport], now_s: float, sent: SentSinceReport
    ) -> list[float]:
        self.priorities.prepare(ask, reports, now_s, sent)
        out = []
        for r in reports:
            p, bar, admitted, _ = self.priorities.of(ask, r, now_s, sent)
            out.append(1.0 if admitted else (min(p / bar, 1.0) if bar > 0 else 0.0))
        return out


class GmaxValue:
    """The request's priority on each replica over its best: where it is worth most."""

    name = "gmax-value"

    def __init__(self, priorities: ReplicaPriorities) -> None:
        self.priorities = priorities

    def score(
        self, ask: Ask, reports: list[ReplicaReport], now_s: float, sent: SentSinceReport
    ) -> list[float]:
        self.priorities.prepare(ask, reports, now_s, sent)
        values = [self.priorities.of(ask, r, now_s, sent)[3] for r in reports]
        best = max(values, default=0.0)
        return [v / best if best > 0 else 0.0 for v in values]


class PowerOfK(Pipeline):
    """Filters ready -> allowed -> not-shedding -> sample-k
    (``k``: None = all); scorers by ``weights`` over :data:`DEFAULT_WEIGHTS` (gmax-admit
    and least-time at 1; gmax-value and least-tokens at 0, not run); picker max-score.
    ``spec``: the SLOPolicy whose GMAX settings score the request (objective, length
    quantile, soft penalty); the default one if None."""

    def __init__(
        self,
        seed: int = 0,
        k: int | None = None,
        spec: SLOPolicySpec | None = None,
        weights: dict[str, float] | None = None,
    ) -> None:
        self.priorities = ReplicaPriorities(spec)
        w = {**DEFAULT_WEIGHTS, **(weights or {})}
        unknown = set(w) - set(DEFAULT_WEIGHTS)
        if unknown:
            raise ValueError(f"unknown power-of-k scorer(s): {', '.join(sorted(unknown))}")
        super().__init__(
            "power-of-k",
            [Ready(), Allowed(), NotShedding(), SampleK(k, seed)],
            [(w["gmax-admit"], GmaxAdmit(self.priorities)),
             (w["gmax-value"], GmaxValue(self.priorities)),
             (w["least-tokens"], LeastTokens()),
             (w["least-time"], LeastTime())],
            MaxScore(seed),
        )  # fmt: skip

    def place(
        self, ask: Ask, reports: Sequence[ReplicaReport], now_s: float
    ) -> Pick | Refusal:
        self.priorities.forget()  # a request placed again sees the reports as they are now
        return super().place(ask, reports, now_s)

    def placed(self, ask: Ask, replica: str) -> None:
        super().placed(ask, replica)
        self.priorities.placed(ask, replica)

    def reported(self, report: ReplicaReport) -> None:
        super().reported(report)
        self.priorities.reported(report.replica)

