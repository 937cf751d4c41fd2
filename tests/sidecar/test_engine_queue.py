"""The engine queue, watched through vLLM's own metrics (real CPU vLLM, tiny model).

With ``--engine-queue Q`` the sidecar keeps up to Q requests waiting *inside* vLLM beyond
its B = ``--max-num-seqs`` running slots, so a slot freed by a finished (or aborted)
request is refilled by vLLM in its next step, not after a round trip through the sidecar.
Observed here through vLLM's ``/metrics`` ``vllm:num_requests_waiting``.

No timing luck: the blockers are long, so vLLM's slots stay full and the sidecar's own
queue stays non-empty by construction; every wait is bounded; and freeing fewer slots
than Q are queued in vLLM means vLLM's waiting queue cannot run dry even if the sidecar
process is not scheduled for seconds. A try in which a request ran to its end anyway
(vLLM outran a starved sidecar and test: its ``finished_reason="length"`` count went up)
built nothing, and is done again: a try lasts ~1 s on an idle machine and a blocker
~20 s of vLLM's decoding, but on a machine with a few busy loops per core a try took 20 s
(1 of 8 runs saw 3 tries in a row built nothing), hence up to TRIES.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from jitserve.bench.live import stream_completion
from jitserve.devstack import vllm as vl
from tests.support.http import get_text, metric, metric_total
from tests.support.sidecar import SidecarProcess, wait_backend_idle
from tests.support.waiting import body_timeout, wait_until

pytestmark = body_timeout(900)

SLOTS = 16  # the session vLLM's --max-num-seqs (conftest.py)
ENGINE_QUEUE = 4
QUEUED = 10  # beyond B: ENGINE_QUEUE of them wait in vLLM, the rest in the sidecar
FREED = 3  # < ENGINE_QUEUE: vLLM keeps a waiting request while the sidecar refills
LONG = 4000  # output tokens (context 4096): nothing finishes while the test looks
POLICY = {
    # no preemption (it would move requests back to the sidecar) and no retirement
    "scheduler": {"preemption": {"enabled": False}},
    "admission": {"maxWaitingSeconds": 3600},
}
BOUND_S = 300.0  # against a hang only: under load vLLM admits 20 requests slowly
TRIES = 8


@pytest.fixture
def sidecar(vllm_url: str, tmp_path: Path) -> Iterator[SidecarProcess]:
    config = tmp_path / "policy.yaml"
    config.write_text(yaml.safe_dump(POLICY))
    wait_backend_idle(vllm_url)
    s = SidecarProcess(vllm_url, config=config, max_running=SLOTS, engine_queue=ENGINE_QUEUE)
    try:
        s.wait_ready()
        yield s
    finally:
        s.close()


def _vllm(vllm_url: str) -> tuple[float, float]:
    text = get_text(vllm_url + "/metrics")
    return (metric(text, "vllm:num_requests_running"),
            metric(text, "vllm:num_requests_waiting"))


def _finished_by_length(vllm_url: str) -> float:
    return metric_total(get_text(vllm_url + "/metrics"), "vllm:request_success_total",
                        finished_reason="length")


class EndedEarly(AssertionError):
    """A request ended while the test looked: a failure unless vLLM had run it whole."""


async def _until(check: Callable[[], bool], what: str, tasks: list[asyncio.Task[Any]],
                 log: Path) -> None:
    deadline = time.monotonic() + BOUND_S
    while not check():
        failed = [t for t in tasks if t.done()]
        if failed and failed[0].exception() is not None:
            raise AssertionError(f"a request failed while waiting for {what}; the sidecar's "
                                 f"log ends:\n{vl.tail(log)}") from failed[0].exception()
        if failed:
            raise EndedEarly(f"a request ended while waiting for {what}: {failed[0].result()}")
        assert time.monotonic() < deadline, f"no {what} within {BOUND_S:.0f} s"
        await asyncio.sleep(0.05)


def test_vllm_waiting_queue_is_fed_while_the_sidecar_holds_requests(
    sidecar: SidecarProcess, vllm_url: str
) -> None:
    body = {"prompt": [5, 17, 99, 400, 23, 8, 77], "max_tokens": LONG, "ignore_eos": True,
            "slo": {"kind": "deadline", "deadline_s": 3600}}

    def state() -> dict[str, Any]:
        return sidecar.state()

    async def scenario() -> list[tuple[int, float]]:
        samples: list[tuple[int, float]] = []
        async with aiohttp.ClientSession() as session:
            blockers = [asyncio.create_task(stream_completion(session, sidecar.url, body))
                        for _ in range(SLOTS)]
            queued: list[asyncio.Task[Any]] = []
            try:
                await _until(lambda: _vllm(vllm_url)[0] == SLOTS, "full vLLM batch", blockers,
                             sidecar.log_path)
                queued = [asyncio.create_task(stream_completion(session, sidecar.url, body))
                          for _ in range(QUEUED)]
                everything = blockers + queued

                # 1. the sidecar dispatches ENGINE_QUEUE beyond vLLM's slots and keeps the rest
                def steady() -> bool:
                    s = state()
                    return (s["running"] == SLOTS + ENGINE_QUEUE
                            and s["waiting"] == QUEUED - ENGINE_QUEUE
                            and _vllm(vllm_url) == (SLOTS, ENGINE_QUEUE))

                await _until(steady, "vLLM waiting = engine queue", everything, sidecar.log_path)
                samples.append((state()["waiting"], _vllm(vllm_url)[1]))

                # 2. free FREED slots (client disconnect aborts the vLLM request): vLLM
                # takes from its own queue at once, the sidecar refills it from its queue
                for task in blockers[:FREED]:
                    task.cancel()
                await asyncio.gather(*blockers[:FREED], return_exceptions=True)
                live = blockers[FREED:] + queued
                deadline = time.monotonic() + BOUND_S
                while True:
                    s_waiting = state()["waiting"]
                    running, waiting = _vllm(vllm_url)
                    if s_waiting == 0 and _finished_by_length(vllm_url) > lengths_before:
                        # blockers ran to their end (a slow machine): their slots took the
                        # sidecar's queue; this try built nothing
                        raise EndedEarly("a request ran to its end while vLLM's queue was "
                                         "refilled")
                    assert s_waiting > 0  # by construction: QUEUED - ENGINE_QUEUE > FREED
                    samples.append((s_waiting, waiting))
                    if (s_waiting == QUEUED - ENGINE_QUEUE - FREED
                            and (running, waiting) == (SLOTS, ENGINE_QUEUE)):
                        break
                    if any(t.done() for t in live):
                        raise EndedEarly("a request ended while vLLM's queue was refilled")
                    assert time.monotonic() < deadline, (
                        f"vLLM's queue not refilled within {BOUND_S:.0f} s: {samples[-5:]}")
                    await asyncio.sleep(0.02)
            finally:
                for task in blockers + queued:
                    task.cancel()
                await asyncio.gather(*blockers, *queued, return_exceptions=True)
        return samples

    def idle() -> bool:
        return (_vllm(vllm_url) == (0, 0)
                and (state()["running"], state()["waiting"]) == (0, 0))

    for _ in range(TRIES):
        wait_until("the sidecar and vLLM idle", idle, BOUND_S)
        lengths_before = _finished_by_length(vllm_url)
        try:
            samples = asyncio.run(scenario())
        except EndedEarly:
            if _finished_by_length(vllm_url) == lengths_before:
                raise
            continue
        if _finished_by_length(vllm_url) == lengths_before:
            break
    else:
        pytest.fail(f"in {TRIES} tries a request had always run to its end in vLLM during "
                    "the try")
    # while the sidecar's queue was non-empty, vLLM's waiting queue never was empty
    assert samples and all(s_waiting > 0 for s_waiting, _ in samples)
    assert all(waiting >= 1 for _, waiting in samples), samples
    assert samples[-1] == (QUEUED - ENGINE_QUEUE - FREED, ENGINE_QUEUE)
    # the cancelled streams are gone from vLLM as well: nothing leaks into other tests
    deadline = time.monotonic() + BOUND_S
    while _vllm(vllm_url) != (0, 0):
        assert time.monotonic() < deadline, f"vLLM still busy: {_vllm(vllm_url)}"
        time.sleep(0.1)
