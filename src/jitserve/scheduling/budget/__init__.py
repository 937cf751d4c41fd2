"""The iteration's token budget (SlidingServe): the rules (:mod:`.rules`: fixed, greedy,
sliding) and the batch constructor (:mod:`.constructor`: which prompts fill a budget)."""

from jitserve.scheduling.budget.rules import (
    LATE_SHARE,
    BudgetRule,
    DecodeSlack,
    StepTime,
    Window,
    best_split,
    choose_budget,
    sliding_prefill,
    time_to_budget,
)

__all__ = [
    "LATE_SHARE", "BudgetRule", "DecodeSlack", "StepTime", "Window", "best_split",
    "choose_budget", "sliding_prefill", "time_to_budget",
]  # fmt: skip
