"""The Fleet: fresh and ready reports only; a replica whose poll fails, hangs or whose
report is stale leaves the picks and comes back with its next good answer; the
command-line flags and their errors.

The report servers here are FAKE sidecar admin ports (aiohttp, in the test's loop): they
inject the faults (a hang, a 500, garbage, a stale report) the real sidecar cannot be
made to produce on demand; the live path is tests/gateway/test_gateway_live.py."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from typing import Any

import pytest
from aiohttp import web

from jitserve.errors import CLIError
from jitserve.gateway.fleet import Discovery, Fleet, add_fleet_flags, fleet_from_args, replica_name
from jitserve.gateway.server import GatewayServer
from jitserve.gateway.settings import GatewaySettings
from jitserve.placement.base import Ask, Pick, ReplicaReport
from jitserve.placement.wire import report_to_json
from jitserve.slo import DeadlineSLO


class FakeAdmin:
    """FAKE: a sidecar admin port serving ``/v1/replica`` in a chosen mode."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.ready = True
        self.age_s = 0.0
        self.polls = 0
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._released: asyncio.Event

    async def replica(self, request: web.Request) -> web.StreamResponse:
        self.polls += 1
        if self.mode == "hang":  # until stop(): a hang the test ends (a handler left
            await self._released.wait()  # sleeping can keep the server's cleanup waiting)
        if self.mode == "500":
            return web.Response(status=500, text="boom")
        if self.mode == "garbage":
            return web.json_response({"replica": "x:1", "ready": "maybe"})
        report = ReplicaReport(replica="0.0.0.0:1", ready=self.ready,
                               at_s=time.time() - self.age_s, max_running=4, running=1,
                               waiting=0)
        return web.json_response(report_to_json(report))

    async def start(self) -> None:
        self._released = asyncio.Event()
        app = web.Application()
        app.router.add_get("/v1/replica", self.replica)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        assert self._runner is not None
        self._released.set()
        await self._runner.cleanup()


async def _until(check: Any, timeout_s: float = 30.0) -> float:
    """Seconds until ``check()`` holds (the timeout only bounds a hang)."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout_s, "timed out"
        await asyncio.sleep(0.02)
    return time.monotonic() - start


def _names(fleet: Fleet) -> list[str]:
    return [r.replica for r in fleet.reports()]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_reports_are_named_by_the_api_url_and_faults_take_a_replica_out() -> None:
    async def go() -> None:
        a, b = FakeAdmin(), FakeAdmin()
        await a.start()
        await b.start()
        seen: list[str] = []
        fleet = Fleet([("http://127.0.0.1:8101", f"http://127.0.0.1:{a.port}"),
                       ("http://127.0.0.1:8102/", f"http://127.0.0.1:{b.port}")],
                      period_s=0.05, max_age_s=0.5, poll_timeout_s=0.2,
                      on_report=lambda r: seen.append(r.replica))
        await fleet.start()
        try:
            both = ["127.0.0.1:8101", "127.0.0.1:8102"]
            await _until(lambda: _names(fleet) == both)
            assert set(seen) == set(both)
            assert fleet.api_url("127.0.0.1:8102") == "http://127.0.0.1:8102"
            for mode in ("hang", "500", "garbage", "stale", "not ready"):
                if mode == "stale":
                    b.age_s = 5.0
                elif mode == "not ready":
                    b.ready = False
                else:
                    b.mode = mode
                state = fleet.replicas["127.0.0.1:8102"]
                # out of the picks AND (but for "not ready") its poll's error recorded: on
                # a starved loop the report can age out before the failed poll returns
                took = await _until(lambda mode=mode, state=state: _names(fleet) == [
                    "127.0.0.1:8101"] and (mode == "not ready" or state.error is not None))
                print(f"{mode}: out of the picks after {took:.2f} s")
                b.mode, b.age_s, b.ready = "ok", 0.0, True
                took = await _until(lambda: _names(fleet) == both)
                print(f"{mode}: back after {took:.2f} s")
            await b.stop()  # connection refused
            await _until(lambda: _names(fleet) == ["127.0.0.1:8101"])
        finally:
            await fleet.stop()
            await a.stop()
    run(go())


def test_discovery_adds_every_address_of_the_name() -> None:
    async def go() -> None:
        a = FakeAdmin()
        await a.start()
        fleet = Fleet(discover=[Discovery("localhost", 8101, a.port)],
                      period_s=0.05, max_age_s=0.5, poll_timeout_s=0.2)
        await fleet.start()
        try:
            await _until(lambda: "127.0.0.1:8101" in _names(fleet))
            assert all(s.discovered for s in fleet.states())
        finally:
            await fleet.stop()
            await a.stop()
    run(go())


def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_fleet_flags(p)
    return p.parse_args(list(argv))


def test_flags() -> None:
    fleet = fleet_from_args(_parse("--replica", "http://127.0.0.1:8101,http://127.0.0.1:9101",
                                   "--replica", "http://h:8102,http://h:9102"))
    assert sorted(fleet.replicas) == ["127.0.0.1:8101", "h:8102"]
    assert fleet.replicas["h:8102"].admin_url == "http://h:9102"
    fleet = fleet_from_args(_parse("--discover", "svc.ns.svc:8080:9090"))
    assert fleet.discover[0].host == "svc.ns.svc" and fleet.discover[0].admin_port == 9090
    assert replica_name("https://example.com/v1") == "example.com:443"


@pytest.mark.parametrize(("argv", "message"), [
    ((), "name the replicas"),
    (("--replica", "http://a:1"), "API_URL,ADMIN_URL"),
    (("--replica", "ftp://a:1,http://a:2"), "not an http"),
    (("--discover", "svc:80"), "HOST:API_PORT:ADMIN_PORT"),
    (("--discover", "svc:x:80"), "HOST:API_PORT:ADMIN_PORT"),
    (("--replica", "http://a:1,http://a:2", "--report-period", "2"), "--report-period"),
])
def test_flag_errors(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(CLIError, match=message):
        fleet_from_args(_parse(*argv))


def test_with_no_fresh_report_at_all_recent_ready_ones_stay_until_panic_seconds() -> None:
    """Every poll hangs (a starved machine, or every sidecar stopped): the replicas ready
    within ``panic_s`` stay in the picks, then leave them."""
    async def go() -> None:
        a, b = FakeAdmin(), FakeAdmin()
        await a.start()
        await b.start()
        fleet = Fleet([("http://127.0.0.1:8101", f"http://127.0.0.1:{a.port}"),
                       ("http://127.0.0.1:8102", f"http://127.0.0.1:{b.port}")],
                      period_s=0.05, max_age_s=0.3, poll_timeout_s=0.2, panic_s=10.0)
        await fleet.start()
        try:
            await _until(lambda: len(_names(fleet)) == 2)
            b.mode = "hang"
            await _until(lambda: _names(fleet) == ["127.0.0.1:8101"])  # a is fresh: b out
            a.mode = "hang"
            # neither is fresh: both back in the picks (panic), then out for good
            await _until(lambda: len(_names(fleet)) == 2)
            assert fleet.in_picks("127.0.0.1:8102")
            took = await _until(lambda: _names(fleet) == [])
            print(f"out of the picks {took:.2f} s into the panic")
            assert not fleet.in_picks("127.0.0.1:8101")
        finally:
            await fleet.stop()
            await a.stop()
            await b.stop()
    run(go())


@pytest.mark.parametrize(("max_age_s", "panic_s"), [(60.0, 5.0), (1.0, 60.0)],
                         ids=["patient", "panic"])
def test_the_gateway_places_on_every_replica_its_fleet_keeps(max_age_s: float,
                                                             panic_s: float) -> None:
    """The fleet is the one judge of freshness: a report 3 s old that it keeps (within
    ``--report-max-age 60``; or, none fresh, within the panic seconds) is placed on by the
    default placement. Before, power-of-k refused every report over 1 s old by its own
    rule: a starved gateway answered 503 while its /ready listed the replica."""
    fleet = Fleet([("http://127.0.0.1:8101", "http://127.0.0.1:9101")],
                  max_age_s=max_age_s, panic_s=panic_s)
    state = fleet.replicas["127.0.0.1:8101"]
    state.report = ReplicaReport("127.0.0.1:8101", True, time.time() - 3.0, 4, 0, 0)
    state.received_s, state.error = time.monotonic() - 3.0, None
    assert _names(fleet) == ["127.0.0.1:8101"]  # what /ready lists
    server = GatewayServer(GatewaySettings(), fleet)
    assert server.router.placer.name == "power-of-k"
    ask = Ask("r", "default", DeadlineSLO(60.0), 10, 100, 50, time.time())
    assert server.router.place(ask, fleet.reports()).outcome == Pick("127.0.0.1:8101")


def test_stop_ends_a_poller_whose_cancel_was_swallowed() -> None:
    """A poll's own timeout firing together with stop()'s cancel turns the cancel into a
    TimeoutError, which the poll counts as a failed poll (seen: a test hung in stop());
    the poll loop still ends."""
    async def go() -> None:
        fleet = Fleet([("http://127.0.0.1:8101", "http://127.0.0.1:9")], period_s=0.01)
        polls = [0]

        async def swallowing_poll(state: Any) -> None:
            polls[0] += 1
            with contextlib.suppress(asyncio.CancelledError):  # what a timeout racing
                await asyncio.sleep(0.05)  # the cancel does

        fleet._poll = swallowing_poll  # type: ignore[method-assign]
        await fleet.start()
        await _until(lambda: polls[0] >= 2)
        await fleet.stop()  # before: never returned (the test's timeout ended it)
    run(go())
