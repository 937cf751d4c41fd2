"""Faults against the real vLLM (CPU build, tiny model): a poison tenant beside a victim,
vLLM frozen (SIGSTOP) and killed (SIGKILL) mid-stream, the analyzer a black hole, SIGTERM
with a drain bound. (Bad policy and key files, hostile programs: test_sidecar_vllm_files.py.)

The freeze and kill tests use a vLLM of their own (``own_vllm``); the others share the
session's. Assertions are on behaviour and on the configured bounds, with slack for a
busy 2-core machine, never on speed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest

from jitserve.bench.live import StreamResult, stream_completion
from tests.support.http import get_json, get_text, metric, post
from tests.support.sidecar import Factory, SidecarProcess, make_factory, wait_backend_idle
from tests.support.stall import StallRelay
from tests.support.vllm import RestartableVLLM
from tests.support.waiting import body_timeout, wait_until

LONG = 4000  # output tokens of a long stream (the session vLLM's context is 4096)
pytestmark = body_timeout(300)

PROMPT = [5, 17, 99, 400, 23, 8, 77]
STALL_S = 5.0
FREEZE_TRIES = 8


def body(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True,
            "slo": {"kind": "deadline", "deadline_s": 900}, **extra}


@pytest.fixture(scope="module")
def own_vllm() -> Iterator[RestartableVLLM]:
    """A private vLLM this module freezes and kills (never the session's shared one)."""
    engine = RestartableVLLM()
    try:
        yield engine
    finally:
        engine.stop()


@pytest.fixture
def own(own_vllm: RestartableVLLM,
        tmp_path: Path) -> Iterator[tuple[RestartableVLLM, Factory]]:
    """The module's own vLLM and a factory of sidecars in front of it; after the test the
    vLLM runs again (SIGCONT) and the sidecars are stopped."""
    started: list[SidecarProcess] = []
    yield own_vllm, make_factory(own_vllm.url, tmp_path, started)
    own_vllm.signal(signal.SIGCONT)
    for s in started:
        s.close()


@pytest.fixture
def own_held(own_vllm: RestartableVLLM, tmp_path: Path
             ) -> Iterator[tuple[RestartableVLLM, StallRelay, Factory]]:
    """As ``own``, with a :class:`StallRelay` between the sidecars and the vLLM."""
    started: list[SidecarProcess] = []
    with StallRelay(own_vllm.url) as relay:
        yield own_vllm, relay, make_factory(relay.url, tmp_path, started)
        for s in started:
            s.close()


T = TypeVar("T")


def first_built(start: Callable[[], SidecarProcess],
                scenario: Callable[[SidecarProcess], Coroutine[Any, Any, T | None]],
                relay: StallRelay) -> tuple[SidecarProcess, T]:
    """Run ``scenario`` on a new sidecar until it built its state (it returns None when
    vLLM had merged a whole stream into the one event the relay let pass), at most 3
    tries; the sidecar of the try that built it, and what that try returned."""
    for _ in range(3):
        s = start()
        outcome = asyncio.run(scenario(s))
        if outcome is not None:
            return s, outcome
        relay.release()
        s.close()
    pytest.fail("in 3 tries vLLM had always sent a stream whole in its first event")


async def running_tokens(s: SidecarProcess, n: int, at_least: int, timeout: float = 90,
                         streams: list[asyncio.Task[StreamResult]] | None = None) -> None:
    """Until ``n`` requests run with ``at_least`` tokens each, or every one of ``streams``
    has ended (then the caller sees how: whole before it looked, or refused)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = s.state()["running_requests"]
        if len(rows) >= n and all(r["generated"] >= at_least for r in rows[:n]):
            return
        if streams and all(t.done() for t in streams):
            return
        assert time.monotonic() < deadline, f"{n} requests never ran: {rows}"
        await asyncio.sleep(0.05)


# ---- a poison tenant beside a victim ---------------------------------------------------
def test_poison_tenant_does_not_take_the_pod_out_of_service(sidecar: Factory) -> None:
    """The poison tenant sends requests vLLM rejects inside a 200 stream (a token id out
    of the vocabulary, an out-of-vocabulary stop token) at 2 req/s while the victim sends
    4 req/s for 15 s: the victim is served in full, /ready stays true, the poison tenant
    gets 400s naming the field."""
    s = sidecar({"fairness": {"tenants": [{"name": "victim"}, {"name": "poison"}]},
                 "admission": {"maxWaitingSeconds": 300}})
    duration = 15.0
    ready_samples: list[int] = []

    async def scenario() -> tuple[list[StreamResult], list[tuple[int, dict[str, Any]]]]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=240)) as session:

            async def victim(i: int) -> StreamResult:
                await asyncio.sleep(i / 4)
                return await stream_completion(session, s.url, body(16),
                                               {"x-tenant": "victim"})

            async def poison(i: int) -> tuple[int, dict[str, Any]]:
                await asyncio.sleep(i / 2)
                bad: dict[str, Any] = ({"prompt": [1_000_000], "max_tokens": 4} if i % 2 == 0
                                       else {**body(4), "stop_token_ids": [99_999_999]})
                async with session.post(s.url + "/v1/completions", json=bad,
                                        headers={"x-tenant": "poison"}) as resp:
                    return resp.status, await resp.json()

            async def watch_ready() -> None:
                start = time.monotonic()
                while time.monotonic() - start < duration + 2:
                    async with session.get(s.url + "/ready") as resp:
                        ready_samples.append(resp.status)
                    await asyncio.sleep(0.25)

            watcher = asyncio.create_task(watch_ready())
            victims = [asyncio.create_task(victim(i)) for i in range(int(duration * 4))]
            poisons = [asyncio.create_task(poison(i)) for i in range(int(duration * 2))]
            results = await asyncio.gather(*victims)
            rejected = await asyncio.gather(*poisons)
            await watcher
            return list(results), list(rejected)

    victims, poisons = asyncio.run(scenario())
    served = [r for r in victims if r.status == 200 and r.error is None
              and len(r.token_ids) == 16 and r.finish_reason == "length"]
    assert len(served) == len(victims) == 60, [(r.status, r.error) for r in victims
                                               if r not in served]
    assert ready_samples and set(ready_samples) == {200}, ready_samples
    assert len(poisons) == 30
    for i, (status, doc) in enumerate(poisons):
        assert status == 400, doc
        assert doc["error"]["param"] == ("prompt" if i % 2 == 0 else "stop_token_ids"), doc
        assert doc["error"]["code"] == "invalid_value" and doc["error"]["message"]
    print(f"poison: victim {len(served)}/{len(victims)} served, /ready 200 in "
          f"{ready_samples.count(200)}/{len(ready_samples)} samples, poison statuses "
          f"{sorted({st for st, _ in poisons})} params "
          f"{sorted({d['error']['param'] for _, d in poisons})}")
    text = get_text(s.url + "/metrics")
    assert metric(text, "jitserve_backend_up") == 1
    assert metric(text, "jitserve_requests_total", tenant="victim", outcome="met") == 60
    with pytest.raises(KeyError):
        metric(text, "jitserve_rejections_total", reason="backend_down")


# ---- vLLM frozen, then killed ------------------------------------------------------------
def test_frozen_vllm_fails_running_streams_within_the_stall_timeout(
    own: tuple[RestartableVLLM, Factory]
) -> None:
    engine, sidecar = own
    s = sidecar(
        {"admission": {"maxWaitingSeconds": 300}},
        extra_args=["--stall-timeout", str(STALL_S)])
    async def scenario() -> tuple[list[StreamResult], float, dict[str, Any]]:
        async with aiohttp.ClientSession() as session:
            streams = [asyncio.create_task(stream_completion(session, s.url, body(LONG)))
                       for _ in range(2)]
            await running_tokens(s, 2, 5, streams=streams)
            engine.signal(signal.SIGSTOP)
            frozen_at = time.monotonic()
            results = await asyncio.wait_for(asyncio.gather(*streams), 120)  # no hang
            if any(len(r.token_ids) >= LONG for r in results):
                return list(results), frozen_at, {}  # the freeze missed: tried again
            # what the sidecar knows of the backend, it says at /ready first (CI saw one
            # request admitted between the streams' stall and the backend marked down)
            deadline = time.monotonic() + 30
            while get_json(s.url + "/ready")[0] != 503 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            async with session.post(s.url + "/v1/completions", json=body(4)) as resp:
                refused = {"status": resp.status, "body": await resp.json(),
                           "retry_after": resp.headers.get("Retry-After")}
            return list(results), frozen_at, refused

    # The freeze must catch both streams mid-run. The sidecar's count can trail what vLLM
    # already sent by a whole stream on a busy machine (seen: 4000 tokens in one burst
    # 0.18 s after SIGSTOP; three misses in a row seen once with the load at 5 on two
    # cores): a freeze that missed is undone and done again.
    for _ in range(FREEZE_TRIES):
        results, frozen_at, refused = asyncio.run(scenario())
        assert all(r.status == 200 for r in results), [(r.status, r.error) for r in results]
        if all(len(r.token_ids) < LONG for r in results):
            break
        engine.signal(signal.SIGCONT)
        wait_until("ready after SIGCONT", lambda: get_json(s.url + "/ready")[0] == 200, 120)
        wait_backend_idle(engine.url)
    else:
        pytest.fail(f"in {FREEZE_TRIES} freezes vLLM had always sent a stream whole before it")
    print("stall: error events", [round(r.end_s - frozen_at, 2) for r in results],
          f"s after SIGSTOP (stall timeout {STALL_S} s)")
    for r in results:
        assert r.status == 200 and 5 <= len(r.token_ids) < LONG, r.error
        assert r.error is not None and r.error["code"] == "backend_failed", r.error
        # the stall timeout, or (seen once in CI, a round after a missed freeze) a stream
        # broken by a late response on its connection: either way it failed, not hung
        assert "stall" in r.error["message"] or "stream broke" in r.error["message"]
    assert refused["status"] == 503 and refused["body"]["error"]["code"] == \
        "backend_unavailable"
    assert int(refused["retry_after"]) >= 1
    assert get_json(s.url + "/ready")[0] == 503
    engine.signal(signal.SIGCONT)
    wait_until("ready after SIGCONT", lambda: get_json(s.url + "/ready")[0] == 200, 120)
    status, _, doc = post(s.url + "/v1/completions", body(8))
    assert status == 200 and doc["usage"]["completion_tokens"] == 8, doc


def test_killed_vllm_fails_running_streams_and_keeps_the_queue(
    own_held: tuple[RestartableVLLM, StallRelay, Factory]
) -> None:
    """vLLM killed while the victim streams and two requests queue behind it: the victim
    ends with an error, /ready turns 503, the queue is kept (it fails only with the
    pod's SIGTERM). The relay passes the victim's first event only, and drops the rest
    once vLLM is dead: the kill lands mid-stream however far ahead of the sidecar vLLM
    ran (else a kill after vLLM had sent the victim whole missed)."""
    engine, relay, sidecar = own_held
    Outcome = tuple[StreamResult, list[StreamResult], dict[str, Any]]

    async def scenario(s: SidecarProcess) -> Outcome | None:
        async with aiohttp.ClientSession() as session:
            relay.hold_after(1)
            victim = asyncio.create_task(stream_completion(session, s.url, body(LONG)))
            await running_tokens(s, 1, 1)  # its one event read: no more reaches the sidecar
            if victim.done() or s.state()["running_requests"][0]["generated"] >= LONG:
                victim.cancel()  # vLLM had merged it whole into that event: try again
                await asyncio.gather(victim, return_exceptions=True)
                return None
            queued = [asyncio.create_task(stream_completion(session, s.url, body(8)))
                      for _ in range(2)]
            await asyncio.to_thread(wait_until, "two requests queued behind the victim",
                                    lambda: s.state()["waiting"] >= 2)
            engine.signal(signal.SIGKILL)
            relay.drop()
            hit = await asyncio.wait_for(victim, 60)
            wait_until("/ready 503", lambda: get_json(s.url + "/ready")[0] == 503, 30)
            _, ready = get_json(s.url + "/ready")
            await asyncio.sleep(2)
            assert not any(t.done() for t in queued), "a queued request was dropped"
            # the pod is stopped: the queued requests end with an error, not silently
            os.kill(s.proc.pid, signal.SIGTERM)
            rest = await asyncio.wait_for(asyncio.gather(*queued), 60)
            return hit, list(rest), ready

    s, (hit, rest, ready) = first_built(
        lambda: sidecar({"admission": {"maxWaitingSeconds": 300},
                         "scheduler": {"preemption": {"enabled": False}}},
                        max_running=1,
                        extra_args=["--drain-seconds", "1", "--stall-timeout", "600"]),
        scenario, relay)
    assert hit.status == 200 and 1 <= len(hit.token_ids) < LONG
    assert hit.error is not None and hit.error["code"] == "backend_failed"
    assert ready["ready"] is False and ready["reason"]
    for r in rest:
        assert r.status == 503 and r.error is not None, (r.status, r.error)
        assert r.error["code"] in ("shutting_down", "backend_unavailable")
    assert s.proc.wait(30) == 0


# ---- shutdown ------------------------------------------------------------------------------
def test_sigterm_drain_is_bounded_and_every_open_stream_gets_an_error(
    held: tuple[StallRelay, Factory]
) -> None:
    """SIGTERM with --drain-seconds 3 while four streams run and eight wait, and none of
    them can finish (the relay passes each vLLM answer's first event only, however far
    ahead vLLM runs): the sidecar still exits, 0, and every stream ends with an error
    event, a started one with the error as its last event. An exit at all is the bound at
    work: without it the held streams would keep the process up forever."""
    relay, sidecar = held

    async def scenario(s: SidecarProcess) -> tuple[list[StreamResult], float] | None:
        async with aiohttp.ClientSession() as session:
            relay.hold_after(1)
            streams = [asyncio.create_task(stream_completion(session, s.url, body(LONG)))
                       for _ in range(12)]  # four run, eight wait
            # each running row has read its one event: the sidecar gets no more of it
            await running_tokens(s, 4, 1)
            if any(t.done() for t in streams) or any(
                    r["generated"] >= LONG for r in s.state()["running_requests"]):
                # vLLM had merged a whole stream into its first event: nothing was built
                for t in streams:
                    t.cancel()
                await asyncio.gather(*streams, return_exceptions=True)
                return None
            os.kill(s.proc.pid, signal.SIGTERM)
            term_at = time.monotonic()
            await asyncio.get_running_loop().run_in_executor(None, s.proc.wait, 120)
            exited = time.monotonic() - term_at
            return list(await asyncio.wait_for(asyncio.gather(*streams), 60)), exited

    s, (results, exited) = first_built(
        lambda: sidecar({"admission": {"maxWaitingSeconds": 300},
                         "scheduler": {"preemption": {"enabled": False}}},
                        max_running=4,
                        extra_args=["--drain-seconds", "3", "--stall-timeout", "600"]),
        scenario, relay)
    print(f"drain: exit {exited:.2f} s after SIGTERM (--drain-seconds 3)")
    assert s.proc.returncode == 0
    for r in results:
        assert len(r.token_ids) < LONG and r.error is not None, (r.status, len(r.token_ids))
        assert r.error["code"] in ("shutting_down", "backend_unavailable"), r.error
        if r.status == 200:  # a stream that had started: its last event is the error
            assert r.finish_reason is None
    assert sum(r.status == 200 and len(r.token_ids) >= 1 for r in results) == 4


# ---- the analyzer, a black hole ------------------------------------------------------------
class BlackHole:
    """Accepts TCP connections and never answers (nor closes them)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


def test_analyzer_black_hole_does_not_stall_requests(sidecar: Factory) -> None:
    hole = BlackHole()
    try:
        s = sidecar(extra_args=["--analyzer", f"127.0.0.1:{hole.port}"])
        started = time.monotonic()
        for i in range(5):
            status, _, doc = post(s.url + "/v1/completions",
                                  body(8, slo={"program_id": "job", "stage": i, "stages": 5})
                                  if i % 2 else body(8))
            assert status == 200 and doc["usage"]["completion_tokens"] == 8, doc
        assert time.monotonic() - started < 60
        text = get_text(s.url + "/metrics")
        assert metric(text, "jitserve_analyzer_client_fallbacks_total") >= 1
        assert get_json(s.url + "/ready")[0] == 200
    finally:
        hole.close()
