"""jitserve's scheduler inside vLLM (owner: engine; loaded by vLLM, never by jitserve).

vLLM loads :class:`~jitserve.engine.vllm_scheduler.SlidingScheduler` (or
:class:`~jitserve.engine.vllm_scheduler.AsyncSlidingScheduler` when async scheduling is
on) with ``--scheduler-cls``; ``scripts/setup-vllm.sh`` makes this package importable in
vLLM's environment. Each step it sets vLLM's token budget by a budget rule
(:mod:`jitserve.scheduling.budget`, the one the simulator uses) from each request's SLO
(passed by the sidecar in the request's ``vllm_xargs``) and a batch-latency model fitted
online from the step times vLLM takes (:mod:`~jitserve.scheduling.estimators.step_model`). Ordering,
admission and fairness stay in the sidecar.

Only :mod:`~jitserve.engine.vllm_scheduler` imports vLLM; the rest of jitserve never
imports this package (an import-linter contract), so jitserve runs without vLLM.
"""
