"""The sidecar's replica report (``GET /v1/replica`` on its admin port): every field read
from the sidecar's real state in front of the session's real vLLM. The state is built,
not hoped for: a :class:`StallRelay` holds vLLM's work so one request runs and two wait
(a full queue: shedding) for as long as the test reads."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from jitserve.bench.stream import stream_completion
from jitserve.devstack import vllm as vl
from jitserve.placement.base import ReplicaReport
from jitserve.placement.wire import report_from_json
from jitserve.sidecar.replica import TokenRate
from jitserve.slo import SLOKind
from tests.sidecar.conftest import Factory
from tests.support.http import get_json
from tests.support.sidecar import SidecarProcess
from tests.support.stall import StallRelay
from tests.support.waiting import body_timeout, wait_until

pytestmark = body_timeout(240)
PROMPT = [5, 17, 99, 400, 23, 8, 77]


def body(max_tokens: int, slo: dict[str, Any]) -> dict[str, Any]:
    return {"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "slo": slo}


def report(admin_url: str) -> ReplicaReport:
    status, doc = get_json(admin_url + "/v1/replica")
    assert status == 200, doc
    return report_from_json(doc)


def test_report_reads_the_sidecars_state(held: tuple[StallRelay, Factory]) -> None:
    relay, sidecar = held
    policy = {"scheduler": {"preemption": {"enabled": False}},
              "admission": {"queueCap": 2, "maxWaitingSeconds": 600}}
    s = sidecar(policy, max_running=1, admin_port=True, extra_args=["--stall-timeout", "600"])
    idle = report(s.admin_url)
    assert idle.ready and idle.max_running == 1
    assert (idle.running, idle.waiting, idle.admit_priority, idle.shedding) == (0, 0, 0.0, False)
    assert idle.replica.endswith(f":{s.port}")
    # the API port does not serve it when an admin port is set
    assert get_json(s.url + "/v1/replica")[0] == 404

    slos = [{"kind": "latency", "ttft_ms": 600_000, "tbt_ms": 600_000},
            {"program_id": "prog-1", "stage": 0, "stages": 2, "deadline_s": 600},
            {"kind": "deadline", "deadline_s": 600}]

    async def scenario() -> tuple[ReplicaReport, list[Any]]:
        async with aiohttp.ClientSession() as session:
            relay.hold()
            tasks = []
            for n, slo in enumerate(slos):
                tasks.append(asyncio.create_task(stream_completion(session, s.url, body(8, slo))))
                while s.state()["running"] + s.state()["waiting"] < n + 1:
                    await asyncio.sleep(0.01)
            busy = await asyncio.to_thread(wait_until, "a report of 1 running and 2 waiting",
                                           lambda: (r := report(s.admin_url)).running == 1
                                           and r.waiting == 2 and r)
            relay.release()
            return busy, list(await asyncio.gather(*tasks))

    busy, served = asyncio.run(scenario())
    assert [len(r.token_ids) for r in served] == [8, 8, 8]
    assert busy.ready and busy.shedding  # the queue is at queueCap
    assert sum(busy.waiting_by_kind.values()) == 2
    assert SLOKind.LATENCY not in busy.waiting_by_kind  # it came first: it runs
    assert busy.admit_priority >= 0.0
    assert busy.programs == frozenset({"default/prog-1"})
    # three prompts' worth of prefill or output is still ahead of three held requests
    assert busy.outstanding_tokens >= 2 * 8
    assert 0.0 <= busy.kv_usage <= 1.0 and busy.decode_s > 0 and busy.prefill_s > 0
    assert busy.token_s > 0 and 0 <= busy.prefill_tokens <= busy.outstanding_tokens

    after = wait_until("an idle report", lambda: (r := report(s.admin_url)).running == 0
                       and r.waiting == 0 and r)
    assert not after.shedding and after.admit_priority == 0.0
    # tokens_per_s: its window is 5 s, which a busy machine can outlast here (a unit test
    # below checks it on a clock of its own)


def test_token_rate_counts_the_last_window() -> None:
    now = [100.0]
    rate = TokenRate(window_s=5.0, clock=lambda: now[0])
    now[0] += 0.05
    assert rate.per_s() == 0.0
    rate.add(10)  # 0.05 s after the start: the span is the 0.1 s floor
    assert rate.per_s() == 100.0
    now[0] += 2.0
    rate.add(10)
    assert rate.per_s() == pytest.approx(20 / 2.05) and rate.last_s == now[0]
    now[0] += 10.0  # both out of the window
    assert rate.per_s() == 0.0


def test_report_is_not_ready_while_vllm_is_down(tmp_path: Path) -> None:
    """A sidecar in front of nothing: it serves, and its report says not ready."""
    config = tmp_path / "policy.yaml"
    config.write_text("{}\n")
    s = SidecarProcess(f"http://127.0.0.1:{vl.free_port()}", config=config,
                       admin_port=True).wait_up()
    try:
        r = report(s.admin_url)
        assert not r.ready and r.running == 0
    finally:
        s.close()
