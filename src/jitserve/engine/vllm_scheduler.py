"""vLLM scheduler classes that set each step's token budget by a jitserve budget rule.

Load with ``--scheduler-cls jitserve.engine.vllm_scheduler.SlidingScheduler``: it builds
the ``AsyncSlidingScheduler`` (on vLLM's ``AsyncScheduler``) itself when async
scheduling is on (vLLM's default on GPUs; the CPU platform turns it off). The rule comes from
``$JITSERVE_ENGINE_BUDGET_RULE`` (``fixed``, ``greedy``, ``sliding``), the engine's
maximum from ``--max-num-batched-tokens``. vLLM's ``Scheduler.schedule()`` reads
``self.max_num_scheduled_tokens`` at every step, so setting it just before is the whole
intervention: vLLM keeps its queue, KV management and preemption. Under vLLM's ``fcfs``
policy the waiting queue (a deque) is also put in SlidingServe's sorter order before each
step (``$JITSERVE_ENGINE_SORTER``, ``slidingserve`` or ``off``): requests that can still
make their first token ahead of those that cannot. Under ``priority`` the priorities the
client (or jitserve's sidecar) set keep their order.
"""

from __future__ import annotations

from typing import Any

from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm.v1.core.sched.scheduler import Scheduler

from jitserve.engine.steps import BudgetSteps

logger = init_logger(__name__)


def _budgeted(base: Any, name: str) -> Any:
    class Budgeted(base):  # type: ignore[misc]
        max_num_scheduled_tokens: int
        jitserve_steps: BudgetSteps

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.jitserve_steps = BudgetSteps.from_env(self.max_num_scheduled_tokens)
            steps = self.jitserve_steps
            steps.sorter = steps.sorter and isinstance(self.waiting, FCFSRequestQueue)
            logger.warning("jitserve engine scheduler %s: budget rule %s, at most %d tokens, "
                           "sorter %s", name, steps.rule.value, steps.most,
                           "slidingserve" if steps.sorter else "off")

        def schedule(self, *args: Any, **kwargs: Any) -> Any:
            steps = self.jitserve_steps
            # the sorter off (vLLM's priority heap): no copy of the queue on the step's path
            order = steps.order(list(self.waiting)) if steps.sorter else None
            if order is not None:
                self.waiting.clear()
                self.waiting.extend(order)
            self.max_num_scheduled_tokens = steps.budget(self.running, self.waiting)
            output = super().schedule(*args, **kwargs)
            steps.scheduled(output)
            return output

        def update_from_output(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            self.jitserve_steps.finished(scheduler_output)
            return super().update_from_output(scheduler_output, *args, **kwargs)

    Budgeted.__name__ = Budgeted.__qualname__ = name
    return Budgeted


SlidingScheduler = _budgeted(Scheduler, "SlidingScheduler")
AsyncSlidingScheduler = _budgeted(AsyncScheduler, "AsyncSlidingScheduler")


def _new(cls: Any, *args: Any, **kwargs: Any) -> Any:
    config = kwargs.get("vllm_config", args[0] if args else None)
    if cls is SlidingScheduler and config is not None and \
            config.scheduler_config.async_scheduling:
        return AsyncSlidingScheduler(*args, **kwargs)  # not a SlidingScheduler: no 2nd init
    return object.__new__(cls)


SlidingScheduler.__new__ = _new
