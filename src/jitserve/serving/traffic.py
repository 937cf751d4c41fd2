"""The record of the traffic a replica served (the tuner's, issue 31): what arrived and
what finished, as the lifecycle saw it (a :class:`~.interface.TrafficObserver`).

A window of it is rebuilt as work items to replay, from the past only: a request that
finished has the output length it produced; one still running, waiting or retired has
what the length estimator expects of it (never the simulator's truth); a compound
program has the stages that had begun, each tool call the gap observed between a
stage's last finish and the next stage's arrival.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

from jitserve.requests import LiveRequest, LLMCall, Phase, Program, Stage, Workitem
from jitserve.slo import CompoundSLO


@dataclass(slots=True)
class _Seen:
    r: LiveRequest
    arrived_s: float
    finished_s: float | None = None


class TrafficRecord:
    """Arrivals and finishes of the last ``keep_s`` seconds (older ones are forgotten at
    each :meth:`window`)."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._seen: deque[_Seen] = deque()
        self._index: dict[LiveRequest, _Seen] = {}

    def __len__(self) -> int:
        return len(self._seen)

    def arrived(self, r: LiveRequest, now_s: float) -> None:
        # the request's own arrival time, not ``now_s``: the simulator's engine takes an
        # arrival at the end of the step it came in, and a replay from then would give
        # every candidate that wait as slack (in the sidecar the two are the same)
        seen = _Seen(r, r.req.arrival_s)
        self._seen.append(seen)
        self._index[r] = seen

    def finished(self, r: LiveRequest, now_s: float) -> None:
        seen = self._index.get(r)
        if seen is not None:
            seen.finished_s = now_s

    def window(self, start_s: float, end_s: float) -> list[Workitem]:
        """The work that arrived in ``[start_s, end_s)``, as it was known at ``end_s``,
        its times shifted so that ``start_s`` is 0, in arrival order."""
        while self._seen and self._seen[0].arrived_s < end_s - self.keep_s:
            del self._index[self._seen.popleft().r]
        items: list[Workitem] = []
        calls: dict[str, list[_Seen]] = {}
        for seen in self._seen:
            if not start_s <= seen.arrived_s < end_s:
                continue
            req = seen.r.req
            if req.program_id is None:
                items.append(replace(req, arrival_s=seen.arrived_s - start_s,
                                     output_tokens=_output(seen.r)))
            else:
                calls.setdefault(req.program_id, []).append(seen)
        items += [p for c in calls.values() if (p := _program(c, start_s)) is not None]
        return sorted(items, key=lambda item: item.arrival_s)


def _output(r: LiveRequest) -> int:
    """What ``r`` produced if it finished, else what the estimator expects of it (at
    least one token more than it has)."""
    if r.phase is Phase.FINISHED:
        return max(r.generated, 1)
    return max(r.generated + 1, round(r.expected), 1)


def _program(calls: list[_Seen], start_s: float) -> Program | None:
    """The program of ``calls`` (every call of it seen in the window), or None when its
    first stage began before the window (it belongs to an earlier one)."""
    stages: dict[int, list[_Seen]] = {}
    for seen in calls:
        stages.setdefault(seen.r.req.stage, []).append(seen)
    if 0 not in stages:
        return None
    first = calls[0].r.req
    assert isinstance(first.slo, CompoundSLO)
    order = sorted(stages)
    built = []
    for i, stage in enumerate(order):
        members = stages[stage]
        tool_s = 0.0
        ends = [s.finished_s for s in members]
        if i + 1 < len(order) and all(end is not None for end in ends):
            next_s = min(s.arrived_s for s in stages[order[i + 1]])
            tool_s = max(next_s - max(e for e in ends if e is not None), 0.0)
        built.append(Stage(tuple(LLMCall(s.r.req.prompt_tokens, _output(s.r), s.r.req.model)
                                 for s in members), tool_s))
    return Program(
        program_id=first.program_id or "",
        tenant=first.tenant,
        arrival_s=min(s.arrived_s for s in stages[0]) - start_s,
        slo=first.slo,
        stages=tuple(built),
        slo_class=first.slo_class,
        app=first.app,
    )
