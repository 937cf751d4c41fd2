"""GMAX: Grouped Margin Goodput Maximization (JITServe paper section 4.2), the policy.

A profile of stages (:mod:`~jitserve.scheduling.frame`) run at every frame over the
waiting table and the running set (DESIGN.md "GMAX scheduler"): score -> pace -> yield ->
group -> sequence -> preempt, selected by ``scheduler.mechanisms`` (an ablation leaves a stage
out or plain). Overload control is two stages around these, shared with the ``-ac``
baselines (:mod:`~jitserve.scheduling.overload`). Between frames the queue is ordered by
the last computed key, and an arrival is scored alone (admission stays cheap).
"""

from __future__ import annotations

import math

import numpy as np

from jitserve.goodput import goodput_if_met
from jitserve.policy import SLOPolicySpec
from jitserve.requests import LiveRequest
from jitserve.scheduling.frame import Stage, no_bar
from jitserve.scheduling.gmax.grouping import GroupFilter
from jitserve.scheduling.gmax.pacing import PrefillPacer
from jitserve.scheduling.gmax.preemption import Preemptor
from jitserve.scheduling.gmax.scoring import FairShare, Score
from jitserve.scheduling.gmax.sequencing import Sequencer, group_key
from jitserve.scheduling.gmax.yielding import FairYield
from jitserve.scheduling.overload import OverloadControl
from jitserve.scheduling.staged import StagedPolicy
from jitserve.scheduling.table import one_row

__all__ = ["GMAX"]


class GMAX(StagedPolicy):
    name = "gmax"
    chunked_prefill = True

    def __init__(self, spec: SLOPolicySpec | None = None, seed: int = 0,
                 overload: OverloadControl | None = None) -> None:
        super().__init__(overload)
        self.fair = FairShare()
        self.scorer = Score(self.fair)
        self.group = GroupFilter(seed)
        self.sequencer = Sequencer(self.fair)
        self.preemptor = Preemptor(self.fair)
        self.yielder = FairYield(self.fair)
        self.pacer: PrefillPacer | None = None
        self.configure(spec or SLOPolicySpec())

    def profile(self, spec: SLOPolicySpec) -> list[Stage]:
        """The stages ``scheduler.mechanisms`` selects, the fair yield with f > 0 (the
        pacer keeps its rate across a reload that keeps it)."""
        m = spec.scheduler.mechanisms
        self.pacer = (self.pacer or PrefillPacer(self.fair)) if m.prefill_pacing else None
        pace = [self.pacer] if self.pacer is not None else []
        preempt = [self.preemptor] if m.preemption and spec.scheduler.preemption.enabled else []
        fair = [self.yielder] if m.fairness and spec.fairness.weight > 0 else []
        return [self.scorer, *pace, *fair, self.group, self.sequencer, *preempt]

    # ---- between frames ---------------------------------------------------------------
    def enqueue(self, r: LiveRequest, now_s: float) -> None:
        """``r`` waits: scored alone at the last frame's speeds, it joins the group if it
        would have made the cut and can still start in time."""
        queue = self.queue
        row, fresh = self.kept.push(r, now_s)
        if fresh and r.started_s is None:  # an arrival (not a preempted request back): demand
            self.fair.books.asked[r.req.tenant] += _worth(r)
        one = one_row(queue.features(), row)
        scores = self.scorer.score(one, now_s)
        hopeless = scores.gain <= 0
        priority = self.fair.blend(scores.priority, one.tenant, hopeless)
        p = float(priority[0])
        queue.floats("priority")[row] = p
        in_group = self.group.admits(p) and self.sequencer.admits(
            p, float(scores.latest_start[0]), now_s
        )
        order = float(self.sequencer.order(scores, priority)[0])
        start_key = self.sequencer.key_of(int(one.tenant[0]), order, bool(hopeless[0]))
        queue.floats("key")[row] = float(
            group_key(priority, np.array([start_key]), np.array([in_group]))[0]
        )

    def peek_next(self, now_s: float, running: int) -> LiveRequest | None:
        """The queue head, among the requests the fair yield lets start; when the pacer
        holds it back, the first of them in queue order whose prompt fits what the pacer
        allows now (None if none does)."""
        queue = self.queue
        allowed = self.yielder.may_start(queue.ints("tenant"), running)
        head = queue.best_row(allowed)
        if head is None or self.pacer is None or running == 0:
            return None if head is None else queue.rows[head]
        prompts = queue.floats("prefill_left")
        budget = self.pacer.budget(now_s, int(prompts[head]))
        if prompts[head] <= budget:
            return queue.rows[head]
        fits = prompts <= budget
        row = queue.best_row(fits if allowed is None else fits & allowed)
        return None if row is None else queue.rows[row]

    def pop_next(self, now_s: float, running: int) -> LiveRequest | None:
        r = self.peek_next(now_s, running)
        if r is None:
            return None
        self.kept.take(r)
        if r.started_s is None:  # a first start (not a preempted request back): service
            self.fair.books.served[r.req.tenant] += _worth(r)
        if self.pacer is not None:
            self.pacer.started(r.prefill_target - r.prefilled)
        return r

    def priority_of(self, r: LiveRequest) -> float:
        row = self.queue.row_of(r)
        if row is not None:
            return float(self.queue.floats("priority")[row])
        return self.kept.priority.get(r, 0.0)

    def earned(self, r: LiveRequest, goodput_tokens: float, now_s: float) -> None:
        self.group.earned(goodput_tokens)

    def admit_priority(self) -> float:
        """The group's bar: p x the B-th best live priority at the last frame (0 when the
        live requests fit the batch), or, under overload, what the frame displaced."""
        return no_bar(max(self.group.threshold, self.sequencer.frontier))

    def resume(self, now_s: float) -> None:
        """The cutoff's epoch and the pacer's clocks start again: the time another
        scheduler ran is not this one's (what they learned, rewards and rate, stays)."""
        self.group.resume()
        if self.pacer is not None:
            self.pacer.resume()

    def describe(self) -> dict[str, float]:
        figures = {"cutoff": self.group.cutoff, "median_priority": self.scorer.median_priority,
                   "fairness_weight": self.fair.f}
        if self.fair.f > 0 and math.isfinite(self.yielder.batch):
            # the running requests at which the tenants above their share wait
            figures["fair_yield_batch"] = self.yielder.batch
        return figures


def _worth(r: LiveRequest) -> float:
    """What ``r`` would earn by meeting its SLO: its tenant's demand at arrival, its
    service at start (the units of the goodput shared)."""
    return goodput_if_met(r.req.slo, r.req.prompt_tokens, r.expected or r.bound)
