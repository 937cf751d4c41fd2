"""What a simulated replica reports to placement (owner: placement helper, simulator).

:func:`engine_report` builds, from one :class:`~jitserve.sim.engine.Engine`'s state,
the :class:`~jitserve.placement.base.ReplicaReport` a sidecar publishes on its admin
port (``GET /v1/replica``): the same fields, read the same way (batch slots, queue by
kind, GMAX's admit priority, the speed meter's figures, KV use, outstanding work), so the
placement code the simulator runs is the code the gateway runs. :func:`ask_of` is what
a gateway knows of a work item before sending it: its SLO, prompt and the estimator's
length bound and expected length (never the true length).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

from jitserve.placement.base import Ask, Placer, ReplicaReport, program_key
from jitserve.requests import Program, Request, Workitem
from jitserve.scheduling.estimators import LengthEstimator
from jitserve.scheduling.staged import StagedPolicy
from jitserve.sim.engine import Engine
from jitserve.slo import SLOKind


class EngineReporter:
    """Builds one engine's reports; keeps the output count of the last one (tokens/s)."""

    def __init__(self, name: str, engine: Engine) -> None:
        self.name = name
        self.engine = engine
        self._last_s = 0.0
        self._last_tokens = 0
        self._tokens_per_s = 0.0

    def report(self, at_s: float) -> ReplicaReport:
        e = self.engine
        e.sync(e.now)
        lc = e.lifecycle
        policy = e.policy
        outstanding = 0.0
        prefill = 0.0
        programs: set[str] = set()
        for r in lc.running:
            prefill += r.prefill_target - r.prefilled
            outstanding += max((r.expected or r.bound) - r.generated, 0)
            if r.program is not None:
                programs.add(program_key(r.req.tenant, r.program.program.program_id))
        by_kind: dict[SLOKind, int] = {}
        if isinstance(policy, StagedPolicy) and len(policy.queue):
            q = policy.queue
            left = q.floats("prefill_left")
            prefill += float(left.sum())
            outstanding += float(q.floats("typical").sum())
            latency = q.flags("is_latency")
            compound = q.ints("program") >= 0
            by_kind = {
                SLOKind.LATENCY: int(latency.sum()),
                SLOKind.COMPOUND: int(compound.sum()),
                SLOKind.DEADLINE: int((~latency & ~compound).sum()),
            }
        else:
            for r in lc.waiting:
                prefill += r.prefill_target - r.prefilled
                outstanding += max((r.expected or r.bound) - r.generated, 0)
                by_kind[r.req.slo.kind] = by_kind.get(r.req.slo.kind, 0) + 1
        tokens = e.stats.output_tokens
        if at_s > self._last_s:
            self._tokens_per_s = (tokens - self._last_tokens) / (at_s - self._last_s)
        self._last_s, self._last_tokens = at_s, tokens
        speed = lc.speed
        return ReplicaReport(
            replica=self.name, ready=True, at_s=at_s, max_running=e.profile.max_running,
            running=e.running, waiting=policy.waiting(),
            waiting_by_kind={k: v for k, v in by_kind.items() if v},
            admit_priority=policy.admit_priority(), decode_s=speed.decode_step_s,
            prefill_s=speed.prefill_s_per_token, tokens_per_s=self._tokens_per_s,
            kv_usage=min(e.kv_used_tokens() / e.profile.kv_capacity_tokens, 1.0),
            outstanding_tokens=int(outstanding + prefill), programs=frozenset(programs),
            token_s=speed.token_s, prefill_tokens=int(prefill),
        )  # fmt: skip


def report_all(reporters: Iterable[EngineReporter], placer: Placer,
               now: float) -> list[ReplicaReport]:
    """Each replica's report at ``now``, as the placer receives them."""
    reports = [r.report(now) for r in reporters]
    for report in reports:
        placer.reported(report)
    return reports


def ask_of(item: Workitem, estimator: LengthEstimator) -> Ask:
    """The :class:`Ask` a gateway would build for ``item``. A program (the simulator's
    unit: all its calls run on one replica) asks for all its calls' prompts and lengths,
    with the tool-call time taken off its deadline."""
    if isinstance(item, Request):
        return Ask(
            request_id=item.request_id, tenant=item.tenant, slo=item.slo,
            prompt_tokens=item.prompt_tokens, output_bound=estimator.bound(item, 0),
            typical_output=math.ceil(estimator.expected(item, 0)),
            arrival_s=item.arrival_s,
        )  # fmt: skip
    assert isinstance(item, Program)
    calls = [r for s in range(len(item.stages)) for r in item.stage_requests(s, item.arrival_s)]
    bound = sum(estimator.bound(r, 0) for r in calls)
    typical = sum(math.ceil(estimator.expected(r, 0)) for r in calls)
    tool_s = sum(s.tool_s for s in item.stages)
    deadline = max(item.slo.deadline_s - tool_s, 1e-3)
    return Ask(
        request_id=item.program_id, tenant=item.tenant,
        slo=replace(item.slo, deadline_s=deadline),
        prompt_tokens=item.input_tokens, output_bound=bound, typical_output=typical,
        arrival_s=item.arrival_s, program=program_key(item.tenant, item.program_id),
    )  # fmt: skip

