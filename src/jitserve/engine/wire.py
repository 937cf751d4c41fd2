"""The wire contract with vLLM for jitserve's in-engine scheduler (pure; no vLLM import).

How jitserve's sidecar, operator and ``jitserve up`` tell vLLM to load the in-engine
scheduler (:func:`engine_scheduler_flags`, with its rule in the environment variable
:data:`RULE_ENV`), and what each request carries for it: the ``vllm_xargs`` keys
:data:`DUE_ARG` and :data:`TBT_ARG`, which vLLM hands its scheduler as
``sampling_params.extra_args``. The one module of :mod:`jitserve.engine` the rest of
jitserve may import; what vLLM loads (:mod:`~jitserve.engine.vllm_scheduler`,
:mod:`~jitserve.engine.steps`) stays forbidden to it (an import-linter contract).
"""

from __future__ import annotations

__all__ = ["DUE_ARG", "RULE_ENV", "SORTERS", "SORTER_ENV", "TBT_ARG", "engine_scheduler_flags"]

DUE_ARG = "jitserve_due_s"
"""vLLM ``vllm_xargs`` key: wall-clock time (epoch s) the dispatch's first token is due."""
TBT_ARG = "jitserve_tbt_s"
"""vLLM ``vllm_xargs`` key: the request's TBT target (0: none, its decodes not protected)."""

RULE_ENV = "JITSERVE_ENGINE_BUDGET_RULE"
"""The environment variable vLLM's engine process reads the in-engine rule from."""
SORTER_ENV = "JITSERVE_ENGINE_SORTER"
"""How the in-engine scheduler orders vLLM's waiting queue: ``slidingserve`` (SlidingServe's
sorter, the default; under vLLM's ``fcfs`` policy only: under ``priority`` the priorities
the client or the sidecar set keep their order) or ``off``."""
SORTERS = ("slidingserve", "off")


def engine_scheduler_flags(async_scheduling: bool = False) -> list[str]:
    """vLLM's flags that load jitserve's in-engine scheduler (:mod:`jitserve.engine`)."""
    cls = "AsyncSlidingScheduler" if async_scheduling else "SlidingScheduler"
    return ["--scheduler-cls", f"jitserve.engine.vllm_scheduler.{cls}"]
