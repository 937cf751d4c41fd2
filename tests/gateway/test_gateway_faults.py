"""Faults through the gateway, on two real sidecar processes in front of the FAKE vLLM
(fast tokens, no model): a replica that fails before the first byte (the request is placed
again), a sidecar SIGKILLed or SIGSTOPped mid-run (its open streams end with an error
event, never silently; it leaves the picks; new requests go to the other; a stopped one
comes back after SIGCONT). The same faults of a real vLLM: test_gateway_live.py.

Seconds to leave the picks are printed, never asserted (a busy machine)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from jitserve.bench.stream import StreamResult, stream_completion
from jitserve.devstack.vllm import free_port
from jitserve.placement.base import ReplicaReport
from jitserve.placement.wire import report_to_json
from tests.gateway.conftest import StackFactory
from tests.support.fake_vllm import FakeVLLM
from tests.support.gateway import (
    PATIENT,
    GatewayProcess,
    nothing_lost,
    streams_until,
    until_every_replica_chosen,
)
from tests.support.http import metric, post
from tests.support.ports import DeadPort
from tests.support.waiting import body_timeout, wait_until

pytestmark = body_timeout(240)
REPLICA = "x-jitserve-replica"
LONG = 1000
"""Tokens of a stream a fault hits: 20 s at the fake's pace, far more than a busy machine
pauses between seeing a victim's first tokens and the signal."""


class LyingAdmin:
    """FAKE: an admin port whose report says "ready" for a replica whose API port is
    closed (a sidecar that died a moment ago, before its reports stopped)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

        async def start() -> tuple[web.AppRunner, int]:
            app = web.Application()
            app.router.add_get("/v1/replica", self.replica)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)  # the port it binds: no race
            await site.start()
            return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

        self.runner, self.port = asyncio.run_coroutine_threadsafe(start(), self.loop).result(30)

    async def replica(self, request: web.Request) -> web.Response:
        return web.json_response(report_to_json(ReplicaReport(
            "dead:1", ready=True, at_s=time.time(), max_running=8, running=0, waiting=0)))

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def fake() -> Iterator[FakeVLLM]:
    backend = FakeVLLM(free_port(), interval_s=0.02)
    yield backend
    backend.close()


def body(n: int) -> dict[str, Any]:
    return {"prompt": [1, 2, 3], "max_tokens": n, "ignore_eos": True}


def test_a_replica_failing_before_the_first_byte_is_skipped(fake: FakeVLLM,
                                                            stack: StackFactory) -> None:
    st = stack([f"http://127.0.0.1:{fake.port}"])
    liar = LyingAdmin()
    dead_port = DeadPort()  # held: a connect there is refused, never answered by another
    dead = f"127.0.0.1:{dead_port.port}"

    class Dead:  # the gateway's view of a sidecar: its two URLs
        url, admin_url, port = dead_port.url, f"http://127.0.0.1:{liar.port}", dead_port.port

    # PATIENT: a late report of the live sidecar would leave only the dead one in the
    # picks, and a request with nowhere to fail over to is a 503
    gw = GatewayProcess([st.sidecars[0], Dead()],
                        st.gateway.log_path.with_name("gw-failover.log"),
                        extra_args=["--placement", "round-robin", *PATIENT])
    try:
        gw.wait_ready(replicas=2)
        # round-robin places every other request on the dead one first while its (lying)
        # report keeps it in the picks; send until two failovers happened (a bound
        # against a hang only)
        sent = 0
        while sent < 40:
            status, headers, doc = post(gw.url + "/v1/completions", body(3))
            sent += 1
            assert status == 200 and doc["usage"]["completion_tokens"] == 3, doc
            assert headers[REPLICA] == gw.names[0]
            text = gw.metrics()
            if "jitserve_gateway_failovers_total{" in text and metric(
                    text, "jitserve_gateway_failovers_total", replica=dead) >= 2:
                break
        assert metric(text, "jitserve_gateway_failovers_total", replica=dead) >= 2, sent
        assert metric(text, "jitserve_gateway_requests_total", replica=gw.names[0],
                      outcome="ok") == sent
    finally:
        gw.close()
        liar.close()
        dead_port.close()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP])
def test_a_sidecar_killed_or_stopped_mid_run(fake: FakeVLLM, stack: StackFactory,
                                             sig: signal.Signals) -> None:
    st = stack([f"http://127.0.0.1:{fake.port}"] * 2,
               gateway_args=("--placement", "round-robin"))
    victim = st.sidecars[0]
    victim_name, survivor_name = st.name(0), st.name(1)
    took: dict[str, float] = {}

    def victim_streaming() -> bool:
        return any(r["generated"] >= 5 for r in victim.state()["running_requests"])

    async def run() -> list[StreamResult]:
        async with aiohttp.ClientSession() as session:
            tasks = await streams_until(session, st.gateway.url, body(LONG), victim_streaming)
            os.kill(victim.proc.pid, sig)
            started = time.monotonic()
            await asyncio.to_thread(wait_until, "the victim out of the picks",
                                    lambda: st.gateway.ready() == [survivor_name])
            took["out"] = time.monotonic() - started
            return list(await asyncio.gather(*tasks))

    try:
        results = asyncio.run(run())
        seen = nothing_lost(results, LONG)
        print(f"{sig.name}: out of the picks after {took['out']:.2f} s; {seen}")
        # each stream the victim held ends with an error event, each the survivor held whole
        on_victim = [r for r in results if r.headers.get(REPLICA) == victim_name]
        assert on_victim and all(r.error is not None for r in on_victim)
        assert seen["whole"] == len(results) - len(on_victim)
        for _ in range(3):  # new requests go to the survivor
            status, headers, _ = post(st.gateway.url + "/v1/completions", body(3))
            assert status == 200 and headers[REPLICA] == survivor_name
        if sig is signal.SIGSTOP:
            os.kill(victim.proc.pid, signal.SIGCONT)
            started = time.monotonic()
            wait_until("the victim back in the picks",
                       lambda: victim_name in st.gateway.ready())
            print(f"back in the picks {time.monotonic() - started:.2f} s after SIGCONT")
            assert until_every_replica_chosen(
                lambda: post(st.gateway.url + "/v1/completions", body(3))[1][REPLICA],
                st.gateway.names) == {victim_name, survivor_name}
    finally:
        if sig is signal.SIGSTOP:
            os.kill(victim.proc.pid, signal.SIGCONT)


def test_a_program_whose_holder_dies_moves_to_one_other_replica(fake: FakeVLLM,
                                                                stack: StackFactory) -> None:
    """The rule when a program's replica dies: its next call is placed afresh, and every
    later call follows it there; the new holder scores the program once."""
    # a late report must not move the program before its holder dies; after, 10 s to leave
    st = stack([f"http://127.0.0.1:{fake.port}"] * 2,
               gateway_args=("--placement", "round-robin", "--report-max-age", "10"))
    slo = {"program_id": "p-move", "stages": 4, "deadline_s": 600}

    def call(stage: int) -> str:
        doc = {**body(3), "slo": {**slo, "stage": stage, "final": stage == 3}}
        status, headers, answer = post(st.gateway.url + "/v1/completions", doc)
        assert status == 200, answer
        return str(headers[REPLICA])

    holder = call(0)
    assert call(1) == holder  # round-robin alone would have alternated
    other = next(n for n in st.gateway.names if n != holder)
    os.kill(st.sidecar_of(holder).proc.pid, signal.SIGKILL)
    wait_until("the holder out of the picks", lambda: st.gateway.ready() == [other])
    assert [call(2), call(3)] == [other, other]

    def outcomes() -> float:
        text, total = st.sidecar_of(other).metrics(), 0.0
        for o in ("met", "missed"):
            with contextlib.suppress(KeyError):
                total += metric(text, "jitserve_requests_total", kind="compound", outcome=o)
        return total

    wait_until("the new holder to score the program", lambda: outcomes() == 1)


def test_a_replica_scaled_down_under_load_drains_and_loses_no_stream(
        fake: FakeVLLM, stack: StackFactory) -> None:
    """Scale-down (a pod deleted: SIGTERM): the replica's open streams finish whole, the
    requests that arrive meanwhile go to the other replica (the draining one refuses them
    before a byte, the gateway places them again, then it leaves the picks), and it exits
    0. The autoscaler removes replicas this way (issue 28)."""
    st = stack([f"http://127.0.0.1:{fake.port}"] * 2,
               gateway_args=("--placement", "round-robin"),
               extra_args=["--drain-seconds", "600"])
    victim = st.sidecars[0]
    victim_name, survivor_name = st.name(0), st.name(1)
    tokens = 200  # 4 s at the fake's pace

    def victim_streaming() -> bool:
        return any(r["generated"] >= 5 for r in victim.state()["running_requests"])

    async def run() -> tuple[list[StreamResult], list[StreamResult]]:
        async with aiohttp.ClientSession() as session:
            before = await streams_until(session, st.gateway.url, body(tokens),
                                         victim_streaming)
            os.kill(victim.proc.pid, signal.SIGTERM)
            await asyncio.to_thread(wait_until, "the victim draining",
                                    lambda: victim.ready()[0] == 503)
            during = [asyncio.create_task(stream_completion(session, st.gateway.url, body(20)))
                      for _ in range(6)]
            return list(await asyncio.gather(*before)), list(await asyncio.gather(*during))

    before, during = asyncio.run(run())
    on_victim = [r for r in before if r.headers.get(REPLICA) == victim_name]
    assert on_victim, "no stream was on the drained replica"
    assert nothing_lost(before, tokens) == {"whole": len(before), "error_event": 0,
                                            "refused": 0}
    assert nothing_lost(during, 20) == {"whole": len(during), "error_event": 0, "refused": 0}
    assert all(r.headers.get(REPLICA) == survivor_name for r in during)
    assert victim.proc.wait(60) == 0
