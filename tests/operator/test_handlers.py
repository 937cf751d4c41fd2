"""The kopf entry points (jitserve.operator.handlers) invoked the way kopf invokes them,
on the in-memory API."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf
from kopf._core.actions.invocation import invoke

from jitserve.operator import builders as b
from jitserve.operator import constants as c
from jitserve.operator.handlers import Controller, WebhookSettings, make_registry
from tests.support.kube_fake import FakeKube, serving

NS = "team-a"
HANG_S = 60.0  # a bound against a hang only


async def _until(what: str, check: Any) -> None:
    deadline = asyncio.get_running_loop().time() + HANG_S
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def test_the_webhook_answers_while_every_handler_thread_waits_on_a_reconcile() -> None:
    """After an apply, a policy's children send a burst of events; each child_event
    handler waits on the policy's reconcile lock in kopf's handler thread pool. The
    webhook (timeoutSeconds 5, failurePolicy Fail) must still be answered then: a
    ``kubectl patch`` right after an apply failed with "context deadline exceeded"
    when validation queued behind those reconciles."""
    kube = FakeKube()
    body = kube.add(
        {
            "apiVersion": c.API_VERSION,
            "kind": c.KIND,
            "metadata": {"name": "chat", "namespace": NS},
            "spec": serving(),
        }
    )
    controller = Controller(kube, b.OperatorSettings())
    registry = make_registry(controller, WebhookSettings(0, "tls.crt", "tls.key"))
    settings = kopf.OperatorSettings()
    activities = registry._activities.get_all_handlers()
    (configure,) = [h for h in activities if h.id.endswith(".configure")]
    configure.fn(settings=settings)  # the operator's own pool size
    workers = settings.execution.max_workers
    assert workers is not None
    watching = registry._watching.get_all_handlers()
    child_events = [h for h in watching if h.id.endswith(".child_event")]
    (validate,) = registry._webhooks.get_all_handlers()
    executor: Any = settings.execution.executor
    child = {
        "metadata": {
            "namespace": NS,
            "name": "chat",
            "ownerReferences": [{"apiVersion": c.API_VERSION, "kind": c.KIND, "name": "chat"}],
        }
    }
    lock = controller._lock(f"{NS}/chat")  # a reconcile of the policy in progress

    async def scenario() -> bool:
        lock.acquire()
        try:
            events = [
                asyncio.create_task(invoke(child_events[0].fn, settings=settings,
                                           kwargs={"body": child}))
                for _ in range(workers + 2)
            ]
            await _until(
                "every handler thread blocked and events queued behind them",
                lambda: len(executor._threads) == workers and executor._work_queue.qsize() > 0,
            )
            answer = asyncio.create_task(
                invoke(validate.fn, settings=settings,
                       kwargs={"body": body, "old": None, "operation": "CREATE"})
            )
            await asyncio.wait({answer}, timeout=HANG_S)
            answered_while_held = answer.done()
        finally:
            lock.release()
        await asyncio.gather(*events, answer)
        return answered_while_held

    try:
        assert asyncio.run(scenario()), "validation waited for the reconciles"
    finally:
        executor.shutdown(wait=True)
    assert controller.metrics.admissions.labels("CREATE", "allowed")._value.get() == 1
    assert ("apps/v1", "Deployment", NS, "chat") in kube.objects  # the events did reconcile
