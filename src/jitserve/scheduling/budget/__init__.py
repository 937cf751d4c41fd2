"""The iteration's token budget (SlidingServe): the rules (:mod:`.rules`: fixed, greedy,
sliding) and the batch constructor (:mod:`.constructor`: which prompts fill a budget)."""

from jitserve.scheduling.budget.rules import (
    DUE_ARG,
    LATE_SHARE,
    RULE_ENV,
    TBT_ARG,
    BudgetRule,
    DecodeSlack,
    StepTime,
    Window,
    best_split,
    choose_budget,
    engine_scheduler_flags,
    sliding_prefill,
    time_to_budget,
)

__all__ = [
    "DUE_ARG", "LATE_SHARE", "RULE_ENV", "TBT_ARG", "BudgetRule", "DecodeSlack", "StepTime",
    "Window", "best_split", "choose_budget", "engine_scheduler_flags", "sliding_prefill",
    "time_to_budget",
]  # fmt: skip
