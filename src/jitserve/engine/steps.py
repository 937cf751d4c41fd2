"""One budget decision per vLLM step, and the step times that fit its model (pure).

:class:`BudgetSteps` is what :mod:`~jitserve.engine.vllm_scheduler` adds to vLLM's
scheduler, kept free of vLLM so it is tested without it: it reads vLLM's request objects
only through the attributes of :class:`EngineRequest`. Before each ``schedule()`` it
turns the running and waiting requests into the budget rule's inputs (the TBT slack of
each decode, the prompt tokens still to compute) and returns the budget; after each step
it feeds the measured step time to the
:class:`~jitserve.scheduling.estimators.step_model.OnlineStepModel`. :meth:`BudgetSteps.order`
puts the waiting requests in SlidingServe's sorter order
(:func:`~jitserve.scheduling.budget.sorter.sorter_keys`: requests that can still make
their first token before those that cannot), each one's prefill timed by the same model.

A request's SLO comes in its ``vllm_xargs`` (vLLM's ``sampling_params.extra_args``), as
the sidecar sets them per dispatch: ``jitserve_due_s``, the wall-clock time (epoch s) its
first token of this dispatch is due, and ``jitserve_tbt_s`` (0: no per-token target, not
protected). Without them (a client talking to vLLM directly) the defaults apply from its
arrival: ``JITSERVE_ENGINE_TTFT_S`` (2 s) and ``JITSERVE_ENGINE_TBT_S`` (0.1 s).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Protocol

import numpy as np

from jitserve.engine.wire import DUE_ARG, RULE_ENV, SORTER_ENV, SORTERS, TBT_ARG
from jitserve.policy import SchedulerSettings
from jitserve.scheduling.budget import BudgetRule, DecodeSlack, choose_budget
from jitserve.scheduling.budget.sorter import sorter_keys
from jitserve.scheduling.estimators.step_model import OnlineStepModel


class EngineRequest(Protocol):
    """The attributes of vLLM's ``Request`` the budget reads."""

    arrival_time: float
    num_computed_tokens: int
    sampling_params: Any

    @property
    def num_tokens(self) -> int: ...

    @property
    def num_output_tokens(self) -> int: ...


@dataclass(frozen=True, slots=True)
class StepRecord:
    """What one step was given and took, as the step log writes it."""

    budget: int
    scheduled: int
    requests: int
    decoders: int
    window: tuple[float, float] | None


class BudgetSteps:
    def __init__(self, rule: BudgetRule, most: int, *, ttft_s: float = 2.0, tbt_s: float = 0.1,
                 sorter: bool = True, log: IO[str] | None = None, clock: Any = time.time,
                 timer: Any = time.monotonic) -> None:
        self.rule = rule
        self.most = most
        self.sorter = sorter
        self.ttft_s = ttft_s
        self.tbt_s = tbt_s
        self.model = OnlineStepModel()
        self._log = log
        self._clock = clock
        self._timer = timer
        self._started: dict[int, tuple[float, int, int]] = {}
        self._last_end = 0.0
        self._decision: tuple[int, int, tuple[float, float] | None] = (most, 0, None)

    @staticmethod
    def from_env(most: int, env: Mapping[str, str] | None = None) -> BudgetSteps:
        env = os.environ if env is None else env
        path = env.get("JITSERVE_ENGINE_STEP_LOG")
        rule = env.get(RULE_ENV, SchedulerSettings().budget_rule.value)  # one default
        sorter = env.get(SORTER_ENV, SORTERS[0])
        if sorter not in SORTERS:
            raise ValueError(f"${SORTER_ENV} must be one of {', '.join(SORTERS)}, got {sorter!r}")
        return BudgetSteps(BudgetRule(rule), most,
                           ttft_s=float(env.get("JITSERVE_ENGINE_TTFT_S", "2.0")),
                           tbt_s=float(env.get("JITSERVE_ENGINE_TBT_S", "0.1")),
                           sorter=sorter != "off",
                           log=open(path, "a", buffering=1) if path else None)

    def _slo(self, r: EngineRequest) -> tuple[float, float]:
        params = getattr(r, "sampling_params", None)
        extra = (getattr(params, "extra_args", None) or {}) if params is not None else {}
        due = float(extra.get(DUE_ARG, r.arrival_time + self.ttft_s))
        return due, float(extra.get(TBT_ARG, self.tbt_s))

    def _next_due(self, r: EngineRequest, out: int) -> tuple[float, float]:
        """When ``r``'s next token is due, with ``out`` tokens already out; its TBT."""
        due, tbt = self._slo(r)
        return due + out * tbt, tbt

    @staticmethod
    def _tokens_left(r: EngineRequest) -> int | None:
        """The most output tokens ``r`` may still produce (its ``max_tokens``)."""
        most = getattr(getattr(r, "sampling_params", None), "max_tokens", None)
        return None if most is None else max(int(most) - r.num_output_tokens, 1)

    def order(self, waiting: Sequence[EngineRequest]) -> list[EngineRequest] | None:
        """``waiting`` in the sorter's order (ties keep vLLM's), or None to leave it as it
        is: the sorter off, or fewer than two waiting."""
        if not self.sorter or len(waiting) < 2:
            return None
        now = self._clock()
        remaining = np.array([max(0, r.num_tokens - r.num_computed_tokens) for r in waiting],
                             dtype=np.float64)
        slack = np.array([self._next_due(r, r.num_output_tokens)[0] - now for r in waiting])
        need = (self.model.prefill_alone(remaining) if self.model.ready
                else np.zeros(len(waiting)))
        keys = sorter_keys(remaining, slack, need)
        return [waiting[i] for i in np.argsort(keys, kind="stable")]

    def budget(self, running: Iterable[EngineRequest], waiting: Iterable[EngineRequest]) -> int:
        """The token budget of the step about to be scheduled."""
        now = self._clock()
        decodes: list[DecodeSlack] = []
        demand = 0
        for r in running:
            left = r.num_tokens - r.num_computed_tokens
            out = r.num_output_tokens + getattr(r, "num_output_placeholders", 0)
            if left <= 1 and out > 0:
                due, tbt = self._next_due(r, out)
                decodes.append(DecodeSlack(due - now, tbt, self._tokens_left(r)))
            else:
                demand += left
        demand += sum(max(0, r.num_tokens - r.num_computed_tokens) for r in waiting)
        n = len(decodes)
        step = self.model.step_time(n)
        budget = choose_budget(self.rule, step, decodes, decoders=n, most=self.most,
                               demand=demand)
        window = None
        if step is not None and decodes:
            protected = [d for d in decodes if d.slack_s >= step(0)]
            if protected:
                window = (min(d.slack_s for d in protected),
                          min(d.slack_s + d.tbt_s for d in protected))
        self._decision = (budget, n, window)
        return budget

    def scheduled(self, output: Any) -> StepRecord:
        """Note a step vLLM scheduled (its ``SchedulerOutput``)."""
        tokens = int(output.total_num_scheduled_tokens)
        requests = len(output.num_scheduled_tokens)
        if tokens:
            self._started[id(output)] = (self._timer(), tokens, requests)
        budget, decoders, window = self._decision
        record = StepRecord(budget, tokens, requests, decoders, window)
        if self._log is not None and tokens:
            self._log.write(json.dumps({"rule": self.rule.value, "budget": budget,
                                        "scheduled": tokens, "requests": requests,
                                        "decoders": decoders, "window": window,
                                        "model": self.model.coef}) + "\n")
        return record

    def finished(self, output: Any) -> None:
        """Note that the step of ``output`` came back: its time fits the model. A step
        scheduled while the one before still ran (async scheduling) starts when that one
        ended."""
        end = self._timer()
        started = self._started.pop(id(output), None)
        if started is not None:
            t0, tokens, requests = started
            self.model.observe(tokens, requests, end - max(t0, self._last_end))
        self._last_end = end
