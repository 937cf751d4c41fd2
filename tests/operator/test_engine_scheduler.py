"""The SLOPolicy's budget rule reaches the vLLM container: a non-fixed rule loads
jitserve's in-engine scheduler (--scheduler-cls) with the rule in its environment."""

from __future__ import annotations

from typing import Any

from jitserve.operator import builders as b
from jitserve.policy import load_policy
from tests.support.kube_fake import serving

REF = b.PolicyRef(name="chat", namespace="team-a", uid="1234")


def vllm_container(doc: dict[str, Any]) -> dict[str, Any]:
    pod = b.build_pod_template(REF, load_policy(serving(doc)), b.OperatorSettings())
    return next(c for c in pod["spec"]["containers"] if c["name"] == "vllm")


def test_fixed_budget_leaves_vllms_own_scheduler() -> None:
    vllm = vllm_container({})
    assert "--scheduler-cls" not in vllm["args"]
    assert all(e["name"] != "JITSERVE_ENGINE_BUDGET_RULE" for e in vllm["env"])


def test_sliding_budget_loads_the_in_engine_scheduler() -> None:
    vllm = vllm_container({"scheduler": {"budgetRule": "sliding"}})
    i = vllm["args"].index("--scheduler-cls")
    assert vllm["args"][i + 1] == "jitserve.engine.vllm_scheduler.SlidingScheduler"
    assert {"name": "JITSERVE_ENGINE_BUDGET_RULE", "value": "sliding"} in vllm["env"]


def test_async_scheduling_gets_the_async_subclass() -> None:
    vllm = vllm_container({"scheduler": {"budgetRule": "greedy"},
                           "model": {"args": ["--async-scheduling"]}})
    i = vllm["args"].index("--scheduler-cls")
    assert vllm["args"][i + 1] == "jitserve.engine.vllm_scheduler.AsyncSlidingScheduler"
