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
from aiohttp import web

from jitserve.bench.stream import stream_completion
from jitserve.devstack import vllm as vl
from jitserve.placement.base import ReplicaReport
from jitserve.placement.wire import report_from_json
from jitserve.sidecar.replica import IDLE_S, KV_QUERY, SCRAPE_S, EngineMetrics, TokenRate
from jitserve.slo import SLOKind
from tests.sidecar.conftest import Factory
from tests.support.http import get_json, get_text
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


class MetricsPages:
    """A FAKE vLLM metrics endpoint (a real aiohttp server) counting its scrapes:
    ``filters`` answers the name-filtered ``/metrics/`` as vLLM's mount does; without it
    ``/metrics/`` is a 404, as on a vLLM whose mount does not filter."""

    def __init__(self, filters: bool) -> None:
        self.filters = filters
        self.hits: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.hits.append(request.path + "?" * bool(request.query_string)
                         + "&".join(f"name[]={n}" for n in request.query.getall("name[]", [])))
        if request.path == "/metrics/" and not self.filters:
            return web.Response(status=404)
        body = "vllm:kv_cache_usage_perc{engine=\"0\"} 0.25\n"
        if request.path == "/metrics":
            body = "vllm:num_requests_running 0.0\n" + body
        return web.Response(text=body)


@pytest.mark.parametrize("filters", [True, False])
def test_vllm_is_scraped_only_while_reports_are_wanted(filters: bool) -> None:
    async def scenario() -> tuple[list[str], float]:
        pages = MetricsPages(filters)
        app = web.Application()
        app.router.add_get("/{tail:.*}", pages.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        port = vl.free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        now = [1000.0]
        engine = EngineMetrics(f"http://127.0.0.1:{port}", clock=lambda: now[0])
        engine.start()
        try:
            async with asyncio.timeout(60):
                while not engine.dormant:  # no report wanted yet: it waits, scrapes nothing
                    await asyncio.sleep(0.01)
                assert pages.hits == []
                engine.wanted()
                while engine.kv_usage == 0.0:
                    await asyncio.sleep(0.01)
                now[0] += IDLE_S + 1  # nobody asked since: it stops
                while not engine.dormant:
                    await asyncio.sleep(0.01)
                seen = len(pages.hits)
                await asyncio.sleep(3 * SCRAPE_S)
                assert len(pages.hits) == seen
                assert not engine.answering(heard_s=-1e18)  # silence is not an answer
                await engine.awake()  # a report asked for again: one scrape, then it says
                assert len(pages.hits) > seen and engine.answering(heard_s=-1e18)
        finally:
            await engine.stop()
            await runner.cleanup()
        return pages.hits, engine.kv_usage

    hits, kv = asyncio.run(scenario())
    assert kv == 0.25
    if filters:
        assert set(hits) == {KV_QUERY}
    else:  # one try of the filtered page, then the full one
        assert hits[0] == KV_QUERY and set(hits[1:]) == {"/metrics"}


def test_the_real_vllm_filters_its_metrics_by_name(vllm_url: str) -> None:
    """What the sidecar asks vLLM for (:data:`KV_QUERY`) is the KV-cache gauge alone,
    a fraction of the full page."""
    full = get_text(vllm_url + "/metrics")
    only = get_text(vllm_url + KV_QUERY)
    assert "vllm:kv_cache_usage_perc" in only and "vllm:kv_cache_usage_perc" in full
    assert "vllm:e2e_request_latency_seconds" in full
    assert "vllm:e2e_request_latency_seconds" not in only
    print(f"vLLM /metrics: {len(full)} bytes in full, {len(only)} filtered")
    assert len(only) * 10 < len(full)
