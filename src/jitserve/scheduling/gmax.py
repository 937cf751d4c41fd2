"""GMAX: Grouped Margin Goodput Maximization (JITServe paper section 4.2).

For every live request r at a frame (DESIGN.md "GMAX scheduler"):

- ``len_rem`` = length bound - generated (the engine refines the bound every
  ``refine_every`` tokens); ``t_gen = prefill_left * prefill_s + len_rem * v_token``;
- ``t_rem`` = time to the deadline (compound: to the stage sub-deadline phi(s) * D);
  latency requests' timeline is fixed by their TBT, so we count the tokens that can
  still be on time instead;
- ``goodput`` = what completing r is worth under the objective, discounted softly when
  r is projected late: ``gain * min(1, t_rem / t_gen) ** penalty``;
- ``priority = goodput / t_gen`` plus ``delta`` x median priority per frame waited;
  members of one compound stage share one priority (sum of gains / max t_gen);
- fairness: ``(1 - f) * priority / max_priority + f * Fair(tenant)``;
- group: keep the top ``k * B`` with priority >= ``p`` x the B-th best, sort by input
  length, take the size-B window with the largest priority sum;
- preempt a running request outside the group only when the priority gained over a
  frame exceeds the recompute stall it causes (``stall_s * batch token rate``);
- overload: retire requests that waited longer than ``maxWaitingSeconds`` without being
  scheduled, or whose deadline cannot be met even at full speed (drop or demote).

The queue between frames is a heap on the last computed priority; arrivals get their
priority when they arrive, so admission stays O(log n). One frame costs O(N log N).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import defaultdict

import numpy as np
import numpy.typing as npt

from jitserve.policy import CutoffMode, Objective, OverloadAction, SLOPolicySpec
from jitserve.requests import LiveProgram, LiveRequest
from jitserve.scheduling.base import (
    EngineView,
    FramePlan,
    QueuedPolicy,
    Retirement,
    RetireReason,
)
from jitserve.slo import LatencySLO

OUTSIDE_GROUP = 1e13
"""Queue keys: members of the chosen group are keyed by their latest start time (seconds,
earliest first); everyone else by ``OUTSIDE_GROUP - priority``, so after the group."""
MIN_TIME_S = 1e-3


def latency_tokens_reachable(
    first_index: npt.NDArray[np.float64],
    count: npt.NDArray[np.float64],
    start_s: npt.NDArray[np.float64],
    per_token_s: float,
    due0_s: npt.NDArray[np.float64],
    tbt_s: npt.NDArray[np.float64],
) -> npt.NDArray[np.float64]:
    """How many of tokens ``first_index .. first_index+count-1`` would be on time if the
    request started producing at ``start_s`` with one token per ``per_token_s``.

    Token i is out at ``start + (i - first + 1) * v`` and due at ``due0 + i * tbt``; the
    lateness changes linearly in i, so the on-time tokens are a prefix or a suffix."""
    # lateness(i) = start + (i - first + 1) v - due0 - i tbt = c0 + i (v - tbt)
    c0 = start_s + (1 - first_index) * per_token_s - due0_s
    slope = per_token_s - tbt_s
    last = first_index + count - 1
    with np.errstate(divide="ignore", invalid="ignore"):
        crossing = np.where(slope != 0, -c0 / np.where(slope != 0, slope, 1.0), np.inf)
    # slope < 0: on time for i >= crossing; slope > 0: on time for i <= crossing
    from_suffix = np.clip(last - np.maximum(np.ceil(crossing - 1e-9), first_index) + 1, 0, count)
    from_prefix = np.clip(np.minimum(np.floor(crossing + 1e-9), last) - first_index + 1, 0, count)
    flat = np.where(c0 <= 1e-9, count, 0.0)
    return np.where(slope < 0, from_suffix, np.where(slope > 0, from_prefix, flat))


class CutoffTuner:
    """Online choice of the cutoff p: epsilon-greedy over candidate values, rewarding
    the goodput (tokens/s) that completed during each epoch of frames."""

    def __init__(
        self, candidates: list[float], start: float, epoch_frames: int, seed: int = 0
    ) -> None:
        self.candidates = sorted(set(candidates) | {start})
        self.value = start
        self.epoch_frames = epoch_frames
        self._reward: dict[float, float] = {}
        self._frames = 0
        self._earned = 0.0
        self._epoch_start_s: float | None = None
        self._epochs = 0
        self._rng = random.Random(seed)

    def reconfigure(self, candidates: list[float], start: float, epoch_frames: int) -> None:
        """New settings on hot reload: what was learned about candidates still offered is
        kept, and so is the current value if it is still a candidate."""
        self.candidates = sorted(set(candidates) | {start})
        self._reward = {c: r for c, r in self._reward.items() if c in self.candidates}
        if self.value not in self.candidates:
            self.value = start
        self.epoch_frames = epoch_frames

    def earned(self, tokens: float) -> None:
        self._earned += tokens

    def on_frame(self, now_s: float) -> None:
        if self._epoch_start_s is None:
            self._epoch_start_s = now_s
        self._frames += 1
        if self._frames < self.epoch_frames:
            return
        elapsed = max(now_s - self._epoch_start_s, MIN_TIME_S)
        rate = self._earned / elapsed
        old = self._reward.get(self.value)
        self._reward[self.value] = rate if old is None else 0.5 * old + 0.5 * rate
        self._epochs += 1
        self._frames, self._earned, self._epoch_start_s = 0, 0.0, now_s
        untried = [c for c in self.candidates if c not in self._reward]
        epsilon = max(0.05, 1.0 / (1 + self._epochs / 4))
        if untried:
            self.value = untried[0]
        elif self._rng.random() < epsilon:
            self.value = self._rng.choice(self.candidates)
        else:
            self.value = max(self._reward, key=lambda c: self._reward[c])


class GMAX(QueuedPolicy):
    name = "gmax"
    chunked_prefill = True

    def __init__(self, spec: SLOPolicySpec | None = None, seed: int = 0) -> None:
        super().__init__()
        self._seed = seed
        self._median_priority = 1.0
        self._decode_s = 0.03
        self._prefill_s = 1e-4
        self._token_s = 1e-4
        self._batch = 256
        self._service: dict[str, float] = defaultdict(float)
        self._seen_generated: dict[LiveRequest, int] = {}
        # policy-private per-request values (never written into the request)
        self._priority: dict[LiveRequest, float] = {}
        self._frames_waited: dict[LiveRequest, int] = {}
        self._demoted: set[LiveRequest] = set()
        self.tuner: CutoffTuner | None = None
        self._last_frame_s: float | None = None
        self._threshold = -math.inf
        """Priority an arrival needs to join the current group (cutoff x B-th best)."""
        self.spec = spec or SLOPolicySpec()
        self.configure(self.spec)

    def configure(self, spec: SLOPolicySpec) -> None:
        """Apply (new) settings; used at start and on hot reload."""
        self.spec = spec
        s = spec.scheduler
        self.frame_steps = s.frame_steps
        if self.tuner is None:
            self.tuner = CutoffTuner(
                s.cutoff.candidates, s.cutoff.value, s.cutoff.epoch_frames, self._seed
            )
        else:
            self.tuner.reconfigure(s.cutoff.candidates, s.cutoff.value, s.cutoff.epoch_frames)
        self.auto_cutoff = s.cutoff.mode is CutoffMode.AUTO
        self.cutoff = self.tuner.value if self.auto_cutoff else s.cutoff.value

    # ---- priorities -----------------------------------------------------------------
    def _priorities(
        self, rs: list[LiveRequest], now_s: float
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """(priority, latest start time that still earns the full gain) per request."""
        n = len(rs)
        if n == 0:
            return np.zeros(0), np.zeros(0)
        v, pf_s = self._decode_s, self._prefill_s
        generated = np.empty(n)
        remaining = np.empty(n)
        typical = np.empty(n)
        prefill_left = np.empty(n)
        prompt = np.empty(n)
        deadline = np.empty(n)
        due0 = np.empty(n)
        tbt = np.empty(n)
        is_latency = np.zeros(n, dtype=bool)
        waited = np.empty(n)
        for i, r in enumerate(rs):
            req = r.req
            g = r.generated
            generated[i] = g
            remaining[i] = max(r.bound - g, 1)
            typical[i] = max((r.expected or r.bound) - g, 1)
            prefill_left[i] = r.prefill_target - r.prefilled
            prompt[i] = req.prompt_tokens
            waited[i] = self._frames_waited.get(r, 0)
            slo = req.slo
            if r in self._demoted:
                deadline[i] = math.inf
            elif isinstance(slo, LatencySLO) and r.program is None:
                is_latency[i] = True
                due0[i] = req.arrival_s + slo.ttft_s
                tbt[i] = slo.tbt_s
            elif r.program is not None:
                deadline[i] = r.program.stage_deadline_abs_s
            else:
                deadline[i] = req.arrival_s + slo.deadline_s  # type: ignore[union-attr]
        t_gen = np.maximum(prefill_left * pf_s + remaining * v, MIN_TIME_S)
        # Cost = share of engine time r will consume: with chunked prefill every prompt and
        # output token takes one unit of the iteration's token budget (token_s each); a
        # decode token also holds one of B batch slots for a step (v / B).
        cost = prefill_left * self._token_s + typical * max(self._token_s, v / self._batch)
        programs = self._program_groups(rs)
        for idx in programs.values():
            t_gen[idx] = t_gen[idx].max()
        t_rem = np.where(is_latency, 0.0, deadline - now_s)
        penalty = self.spec.scheduler.soft_penalty
        feasible = np.clip(np.where(t_rem > 0, t_rem / t_gen, 0.0), 0.0, 1.0) ** penalty
        tokens_objective = self.spec.objective is Objective.TOKENS
        gain = (prompt + generated + typical if tokens_objective else np.ones(n)) * feasible
        # latest start that still earns everything: the sequencing key inside the group
        latest_start = deadline - (prefill_left * pf_s + typical * v)
        if is_latency.any():
            idx = np.flatnonzero(is_latency)
            start = now_s + prefill_left[idx] * pf_s
            ontime = latency_tokens_reachable(
                generated[idx], typical[idx], start, v, due0[idx], tbt[idx]
            )
            gain[idx] = ontime if tokens_objective else (ontime >= typical[idx])
            latest_start[idx] = (
                due0[idx] + generated[idx] * tbt[idx] - (prefill_left[idx] + 1) * pf_s
            )
        demoted = ~np.isfinite(deadline) & ~is_latency
        gain[demoted] = 1e-3 * (prompt[demoted] + typical[demoted])
        for idx in programs.values():
            # One priority per compound stage: the stage's gain over the stage's cost.
            gain[idx] = gain[idx].sum() / idx.size
            cost[idx] = cost[idx].sum() / idx.size
            latest_start[idx] = latest_start[idx].min()
        priority = gain / np.maximum(cost, 1e-9)
        positive = priority[priority > 0]
        if positive.size:
            self._median_priority = float(np.median(positive))
        priority += self.spec.scheduler.delta * self._median_priority * waited
        return priority, latest_start

    @staticmethod
    def _program_groups(rs: list[LiveRequest]) -> dict[LiveProgram, npt.NDArray[np.intp]]:
        groups: dict[LiveProgram, list[int]] = defaultdict(list)
        for i, r in enumerate(rs):
            if r.program is not None:
                groups[r.program].append(i)
        return {lp: np.array(members) for lp, members in groups.items()}

    def _key(self, priority: float, latest_start: float, in_group: bool) -> float:
        return min(latest_start, OUTSIDE_GROUP / 2) if in_group else OUTSIDE_GROUP - priority

    def _fair(self, rs: list[LiveRequest]) -> npt.NDArray[np.float64]:
        fairness = self.spec.fairness
        total = sum(self._service.values())
        tenants = {r.req.tenant for r in rs}
        weights = {t: fairness.weight_of(t) for t in tenants}
        weight_sum = sum(weights.values()) or 1.0
        fair = {}
        for t in tenants:
            share = weights[t] / weight_sum
            received = self._service.get(t, 0.0) / total if total > 0 else share
            fair[t] = share / (share + received)
        return np.array([fair[r.req.tenant] for r in rs])

    # ---- queue ------------------------------------------------------------------------
    def enqueue(self, r: LiveRequest, now_s: float) -> None:
        priority, latest_start = self._priorities([r], now_s)
        p = self._priority[r] = float(priority[0])
        self.queue.push(r, self._key(p, float(latest_start[0]), p >= self._threshold))

    def priority_of(self, r: LiveRequest) -> float:
        return self._priority.get(r, 0.0)

    def remove(self, r: LiveRequest) -> None:
        super().remove(r)
        self._forget(r)

    def on_finish(self, r: LiveRequest, goodput_tokens: float, now_s: float) -> None:
        assert self.tuner is not None
        self.tuner.earned(goodput_tokens)
        self._account_service(r)
        self._forget(r)

    def _forget(self, r: LiveRequest) -> None:
        self._seen_generated.pop(r, None)
        self._priority.pop(r, None)
        self._frames_waited.pop(r, None)
        self._demoted.discard(r)

    def describe(self) -> dict[str, float]:
        return {"cutoff": self.cutoff, "median_priority": self._median_priority}

    def _account_service(self, r: LiveRequest) -> None:
        seen = self._seen_generated.get(r, 0)
        if r.generated > seen:
            self._service[r.req.tenant] += r.generated - seen
            self._seen_generated[r] = r.generated

    # ---- the frame -------------------------------------------------------------------
    def frame(self, view: EngineView) -> FramePlan:
        now = view.now_s
        self._decode_s = max(view.decode_step_s, MIN_TIME_S)
        self._prefill_s = view.prefill_s_per_token
        self._token_s = view.token_s or view.prefill_s_per_token
        self._batch = view.max_running
        self._decay_service(now)
        if self.auto_cutoff:
            assert self.tuner is not None
            self.tuner.on_frame(now)
            self.cutoff = self.tuner.value
        plan = FramePlan()
        waiting = self.queue.members()
        for r in waiting:
            self._frames_waited[r] = self._frames_waited.get(r, 0) + 1
        running = list(view.running)
        for r in running:
            self._account_service(r)
        # Overload control (seed 003): give up on deadlines that cannot be met even at
        # full speed, before they take a place in the group.
        self._give_up(
            [r for r in (*running, *waiting) if self._unreachable(r, now)],
            RetireReason.UNREACHABLE,
            plan,
        )
        gone = plan.retired()
        running = [r for r in running if r not in gone]
        waiting = [r for r in waiting if r not in gone]
        live = running + waiting
        if not live:
            self.queue.rebuild([])
            return plan
        priority, latest_start = self._priorities(live, now)
        f = self.spec.fairness.weight
        if f > 0:
            top = float(priority.max()) or 1.0
            priority = (1 - f) * priority / top + f * self._fair(live)
        for r, p in zip(live, priority, strict=True):
            self._priority[r] = float(p)
        chosen = self._group(live, priority, view.max_running)
        self._admit_feasible(live, len(running), priority, latest_start, chosen, now)
        # Admission control (paper section 5): retire a request that waited past the
        # maximum waiting time and that the scheduler still does not plan to serve. One it
        # plans to serve (in the group, projected to start in time) stays: on bursty
        # traffic (azure-code) dropping those too cost a third of the token goodput.
        first = len(running)
        overdue = [
            r for i, r in enumerate(waiting) if not chosen[first + i] and self._overdue(r, now)
        ]
        self._give_up(overdue, RetireReason.MAX_WAITING, plan)
        gone = set(overdue)
        self.queue.rebuild(
            (self._key(self._priority[r], float(latest_start[first + i]), chosen[first + i]), r)
            for i, r in enumerate(waiting)
            if r not in gone
        )
        self._preempt(view, running, waiting, chosen, plan)
        return plan

    def _group(
        self, live: list[LiveRequest], priority: npt.NDArray[np.float64], batch: int
    ) -> npt.NDArray[np.bool_]:
        """Cutoff filter + input-length sliding window; returns a mask over ``live``."""
        n = len(live)
        chosen = np.zeros(n, dtype=bool)
        self._threshold = -math.inf
        if n <= batch:
            chosen[:] = True
            return chosen
        k = min(n, self.spec.scheduler.candidate_factor * batch)
        top = np.argpartition(-priority, k - 1)[:k] if k < n else np.arange(n)
        bth = float(np.partition(priority[top], len(top) - batch)[len(top) - batch])
        self._threshold = self.cutoff * bth
        candidates = top[priority[top] >= self._threshold]
        if candidates.size <= batch:
            chosen[candidates] = True
            return chosen
        lengths = np.array([live[i].context_tokens for i in candidates])
        ordered = candidates[np.argsort(lengths, kind="stable")]
        sums = np.convolve(priority[ordered], np.ones(batch), mode="valid")
        best = int(np.argmax(sums))
        chosen[ordered[best : best + batch]] = True
        return chosen

    def _admit_feasible(
        self,
        live: list[LiveRequest],
        n_running: int,
        priority: npt.NDArray[np.float64],
        latest_start: npt.NDArray[np.float64],
        chosen: npt.NDArray[np.bool_],
        now: float,
    ) -> None:
        """Overload control inside the group (seed 003: urgency must not cascade).

        Walk the waiting group members in latest-start order, projecting when each would
        start given the prompts queued ahead of it (running prefills first). A member that
        would start too late displaces lower-priority members ahead of it if that makes it
        feasible; otherwise it leaves the group (it is then served only with spare capacity
        and retired by the waiting-time rule). Weighted Moore-Hodgson, O(N log N)."""
        pf_s = self._prefill_s
        backlog = sum(r.prefill_target - r.prefilled for r in live[:n_running]) * pf_s
        members = [i for i in range(n_running, len(live)) if chosen[i]]
        members.sort(key=lambda i: latest_start[i])
        accepted: list[tuple[float, int]] = []  # min-heap on priority
        for i in members:
            size = (live[i].prefill_target - live[i].prefilled) * pf_s
            overflow = now + backlog - latest_start[i]
            evicted: list[tuple[float, int]] = []
            while overflow > 0 and accepted and accepted[0][0] < priority[i]:
                p_j, j = heapq.heappop(accepted)
                evicted.append((p_j, j))
                j_size = (live[j].prefill_target - live[j].prefilled) * pf_s
                overflow -= j_size
                backlog -= j_size
            if overflow > 0:  # cannot be made feasible: undo the evictions, drop i
                for p_j, j in evicted:
                    heapq.heappush(accepted, (p_j, j))
                    backlog += (live[j].prefill_target - live[j].prefilled) * pf_s
                chosen[i] = False
                continue
            for _, j in evicted:
                chosen[j] = False
            heapq.heappush(accepted, (float(priority[i]), i))
            backlog += size

    def _preempt(
        self,
        view: EngineView,
        running: list[LiveRequest],
        waiting: list[LiveRequest],
        chosen: npt.NDArray[np.bool_],
        plan: FramePlan,
    ) -> None:
        settings = self.spec.scheduler.preemption
        free = view.max_running - len(running)
        challengers = sorted(
            (r for i, r in enumerate(waiting) if chosen[len(running) + i]),
            key=lambda r: -self._priority[r],
        )[max(free, 0) :]
        if not settings.enabled or not challengers:
            return
        victims = sorted(
            (r for i, r in enumerate(running) if not chosen[i]), key=lambda r: self._priority[r]
        )
        frame_s = self.frame_steps * self._decode_s
        token_rate = max(len(running), 1) / self._decode_s
        for challenger, victim in zip(challengers[: settings.max_per_frame], victims, strict=False):
            gain = (self._priority[challenger] - self._priority[victim]) * frame_s
            stall_s = victim.context_tokens * self._token_s
            if gain > settings.cost_factor * stall_s * token_rate:
                plan.preempt.append(victim)

    def _unreachable(self, r: LiveRequest, now: float) -> bool:
        """A deadline that cannot be met even if r ran alone at full speed from now."""
        if r in self._demoted or (isinstance(r.req.slo, LatencySLO) and r.program is None):
            return False
        deadline = r.program.deadline_abs_s if r.program is not None else r.deadline_abs_s
        fastest = (r.prefill_target - r.prefilled) * self._prefill_s + self._decode_s
        return now + fastest > deadline

    def _overdue(self, r: LiveRequest, now: float) -> bool:
        waited = now - r.req.arrival_s
        return r.started_s is None and waited > self.spec.admission.max_waiting_seconds

    def _give_up(self, rs: list[LiveRequest], reason: RetireReason, plan: FramePlan) -> None:
        demote = self.spec.admission.overload_action is OverloadAction.DEMOTE
        for r in rs:
            if r in self._demoted:
                continue
            if demote:
                self._demoted.add(r)
            else:
                plan.retire.append(Retirement(r, reason))

    def _decay_service(self, now: float) -> None:
        if self._last_frame_s is not None:
            decay = math.exp(-(now - self._last_frame_s) / self.spec.fairness.window_seconds)
            for t in self._service:
                self._service[t] *= decay
        self._last_frame_s = now
