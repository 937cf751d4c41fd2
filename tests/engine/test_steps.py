"""The in-engine scheduler's step logic (jitserve.engine.steps), without vLLM: its inputs
from vLLM-shaped requests, the step-time fit, and the budget it then sets."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any

from jitserve.engine.steps import BudgetSteps
from jitserve.engine.wire import DUE_ARG, TBT_ARG
from jitserve.scheduling.budget import BudgetRule
from jitserve.scheduling.estimators.step_model import OnlineStepModel


@dataclass
class Params:
    extra_args: dict[str, Any] | None = None
    max_tokens: int | None = None


@dataclass
class Req:
    """The attributes of vLLM's Request that the budget reads."""

    arrival_time: float
    num_prompt_tokens: int
    num_computed_tokens: int
    num_output_tokens: int = 0
    sampling_params: Params = field(default_factory=Params)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens


@dataclass
class Out:
    total_num_scheduled_tokens: int
    num_scheduled_tokens: dict[str, int]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_online_model_recovers_a_step_time_law() -> None:
    model = OnlineStepModel(min_samples=8, refit_every=1)
    assert not model.ready
    for tokens in range(64, 4096, 128):
        model.observe(tokens, 4, 0.01 + 2e-5 * tokens + 1e-9 * tokens * tokens)
    assert model.ready
    assert abs(model.predict(2000, 4) - (0.01 + 0.04 + 0.004)) < 1e-6


def fitted(steps: BudgetSteps, timer: Clock) -> None:
    """Feed steps whose time is 20 ms + 0.1 ms per token."""
    for i in range(40):
        tokens = 32 + 100 * i
        out = Out(tokens, {"a": tokens})
        steps.scheduled(out)
        timer.t += 0.02 + 1e-4 * tokens
        steps.finished(out)


def test_budget_protects_the_tightest_decode_and_logs_each_step() -> None:
    clock, timer, log = Clock(), Clock(), io.StringIO()
    steps = BudgetSteps(BudgetRule.GREEDY, 4096, log=log, clock=clock, timer=timer)
    decode = Req(arrival_time=999.0, num_prompt_tokens=100, num_computed_tokens=109,
                 num_output_tokens=10,
                 sampling_params=Params({DUE_ARG: 999.5, TBT_ARG: 0.05}))  # due 1000.0
    prefill = Req(arrival_time=999.9, num_prompt_tokens=8000, num_computed_tokens=0)
    assert steps.budget([decode], [prefill]) == 4096  # no step times yet: fixed
    fitted(steps, timer)
    # the decode's 11th token is due at 999.5 + 10 * 0.05 = 1000.0 + 0.3 s from now
    decode.sampling_params.extra_args = {DUE_ARG: 999.8, TBT_ARG: 0.05}
    budget = steps.budget([decode], [prefill])
    # fills the 300 ms slack (the decode and one prompt in the step), no more
    assert 0.2998 < steps.model.predict(budget, 2) <= 0.3
    steps.scheduled(Out(budget, {"d": 1, "p": budget - 1}))
    last = json.loads(log.getvalue().splitlines()[-1])
    assert last["budget"] == budget and last["decoders"] == 1 and last["rule"] == "greedy"


def test_defaults_apply_without_xargs_and_fixed_keeps_the_maximum() -> None:
    clock, timer = Clock(), Clock()
    steps = BudgetSteps(BudgetRule.FIXED, 2048, clock=clock, timer=timer)
    fitted(steps, timer)
    decode = Req(arrival_time=999.0, num_prompt_tokens=10, num_computed_tokens=19,
                 num_output_tokens=10)
    assert steps.budget([decode], []) == 2048
    greedy = BudgetSteps(BudgetRule.GREEDY, 2048, ttft_s=0.5, tbt_s=0.03, clock=clock,
                         timer=timer)
    fitted(greedy, timer)
    # due 999 + 0.5 + 10 * 0.03 = 999.8: already late, and TBT / 2 = 15 ms is under even
    # a decode-only step (20 ms: 10 ms + 0.1 ms a token + 10 ms a request): nothing helps
    assert greedy.budget([decode], [Req(999.9, 5000, 0)]) == 2048
    decode.arrival_time = 999.3  # due 1000.1 with the defaults: 100 ms slack
    assert greedy.budget([decode], [Req(999.9, 5000, 0)]) < 2048


def test_the_sorter_puts_what_can_still_make_its_first_token_first() -> None:
    clock, timer = Clock(), Clock()
    steps = BudgetSteps(BudgetRule.SLIDING, 2048, clock=clock, timer=timer)
    fitted(steps, timer)  # a 1,000-token prefill alone: 20 ms + 0.1 s = 0.12 s
    late = Req(arrival_time=990.0, num_prompt_tokens=100, num_computed_tokens=0)  # due 992
    long = Req(999.5, 1000, 0, sampling_params=Params({DUE_ARG: 1000.2}))  # 0.12 of 0.2 s
    short = Req(999.9, 100, 0)  # due 1001.9: 0.04 s of 1.9 s
    also_short = Req(999.95, 100, 0)
    tight = Req(999.5, 1000, 0, sampling_params=Params({DUE_ARG: 1000.1}))  # 0.12 > 0.1 s
    order = steps.order([late, short, tight, long, also_short])
    # safeguarded (urgency >= 0.5) first, then the rest on time (ties in vLLM's order),
    # then those that cannot make it, shortest remaining prefill first
    assert order == [long, short, also_short, late, tight]
    assert steps.order([late]) is None
    steps.sorter = False
    assert steps.order([late, short]) is None


def test_the_sorter_is_read_from_the_environment() -> None:
    assert BudgetSteps.from_env(512, {}).sorter
    assert not BudgetSteps.from_env(512, {"JITSERVE_ENGINE_SORTER": "off"}).sorter
    try:
        BudgetSteps.from_env(512, {"JITSERVE_ENGINE_SORTER": "edf"})
    except ValueError as e:
        assert "JITSERVE_ENGINE_SORTER" in str(e) and "slidingserve, off" in str(e)
    else:
        raise AssertionError("an unknown sorter was accepted")


def test_a_decode_whose_max_tokens_cannot_catch_up_leaves_the_budget_alone() -> None:
    clock, timer = Clock(), Clock()
    steps = BudgetSteps(BudgetRule.GREEDY, 2048, clock=clock, timer=timer)
    fitted(steps, timer)
    # 10 tokens out, the 11th due at 999.5 + 10 * 0.1 = 1000.5 - 30 s: 30 s behind
    late = {DUE_ARG: 969.5, TBT_ARG: 0.1}
    prompt = Req(999.9, 5000, 0)
    behind = Req(999.0, 10, 19, 10, Params(late, max_tokens=4000))  # can gain 0.05 s x 3990
    assert steps.budget([behind], [prompt]) < 2048
    hopeless = Req(999.0, 10, 19, 10, Params(late, max_tokens=128))  # 0.05 s x 118 < 30 s
    assert steps.budget([hopeless], [prompt]) == 2048
