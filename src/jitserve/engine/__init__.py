"""jitserve's scheduler inside vLLM (owner: engine; loaded by vLLM) and its wire contract.

vLLM loads :class:`~jitserve.engine.vllm_scheduler.SlidingScheduler` (or
:class:`~jitserve.engine.vllm_scheduler.AsyncSlidingScheduler` when async scheduling is
on) with ``--scheduler-cls``; ``scripts/setup-vllm.sh`` makes this package importable in
vLLM's environment. Each step it sets vLLM's token budget by a budget rule
(:mod:`jitserve.scheduling.budget`, the one the simulator uses) from each request's SLO
(passed by the sidecar in the request's ``vllm_xargs``) and a batch-latency model fitted
online from the step times vLLM takes (:mod:`~jitserve.scheduling.estimators.step_model`). Ordering,
admission and fairness stay in the sidecar.

How vLLM is told to load it and what each request carries for it (the ``--scheduler-cls``
flags, the rule's environment variable, the ``vllm_xargs`` keys) is :mod:`~jitserve.engine.wire`,
pure, the one module here the sidecar, operator and ``jitserve up`` import. Only
:mod:`~jitserve.engine.vllm_scheduler` imports vLLM; the rest of jitserve never imports
it nor :mod:`~jitserve.engine.steps` (an import-linter contract), so jitserve runs without
vLLM. This file imports neither, so importing the wire loads no vLLM.
"""
