"""``jitserve gateway`` in front of two real sidecar processes: placement, streaming,
pass-through, refusals and the door's limits.

The sidecars run in front of the suite's FAKE vLLM (tests/support/fake_vllm.py): these
tests are about the gateway's rules, and need an engine that holds its streams on demand
(``pause_at``) and costs nothing; the same paths against the real tiny vLLM are in
test_gateway_live.py."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from jitserve.bench.stream import StreamResult, stream_completion
from jitserve.devstack.vllm import free_port
from jitserve.gateway.proxy import ClientLeft, to_client
from tests.gateway.conftest import Stack, StackFactory
from tests.support.fake_vllm import FakeVLLM
from tests.support.gateway import PATIENT
from tests.support.http import get_json, metric, post
from tests.support.waiting import body_timeout, wait_until

pytestmark = body_timeout(240)
REPLICA = "x-jitserve-replica"


@pytest.fixture
def fake() -> Iterator[FakeVLLM]:
    backend = FakeVLLM(free_port(), interval_s=0.005)
    yield backend
    backend.close()


def body(n: int = 8, **extra: Any) -> dict[str, Any]:
    return {"prompt": [1, 2, 3], "max_tokens": n, **extra}


async def streams(url: str, bodies: list[dict[str, Any]], headers: dict[str, str] | None = None,
                  path: str = "/v1/completions") -> list[StreamResult]:
    async with aiohttp.ClientSession() as session:
        return list(await asyncio.gather(*(stream_completion(session, url, b, headers, path)
                                           for b in bodies)))


def fleet_view(stack: Stack) -> dict[str, dict[str, Any]]:
    _, doc = get_json(stack.gateway.admin_url + "/debug/fleet")
    return {r["name"]: r for r in doc["replicas"]}


def served(stack: Stack, replica: str) -> float:
    """Requests the sidecar behind ``replica`` counted (its own metrics)."""
    text = stack.sidecar_of(replica).metrics()
    try:
        return metric(text, "jitserve_requests_total")
    except KeyError:
        return 0.0


def test_requests_land_where_the_placer_chose_and_stream_through(
        fake: FakeVLLM, stack: StackFactory) -> None:
    st = stack([f"http://127.0.0.1:{fake.port}"] * 2,
               gateway_args=("--placement", "round-robin", *PATIENT))
    order = sorted(st.gateway.names)
    chosen = []
    for i in range(4):  # one at a time, each once both replicas are in the picks
        wait_until("both replicas in the gateway's picks", lambda: metric(
            st.gateway.metrics(), "jitserve_gateway_replicas", state="ready") == 2)
        (result,) = asyncio.run(streams(st.gateway.url, [body(8 + i)]))
        assert result.status == 200 and len(result.token_ids) == 8 + i
        assert result.finish_reason == "length" and result.error is None
        assert len(set(result.token_times)) > 1  # the tokens came as a stream, not at once
        chosen.append(result.headers[REPLICA])
    # Round-robin alternates while both stay pickable; a sidecar's scrape of the engine
    # late on a busy machine takes it out of the picks for a moment (its own tests), so
    # the order is not asserted here, only that both served and where.
    assert set(chosen) == set(order), chosen
    expected = [chosen.count(r) for r in order]
    # the sidecars agree: each served the ones the gateway says it sent there
    wait_until(f"the sidecars to count {expected}",
               lambda: [served(st, r) for r in order] == expected)
    # counted once the replica's stream ended, which may be after the client read [DONE]
    wait_until(f"the gateway to count {expected}", lambda: [metric(
        st.gateway.metrics(), "jitserve_gateway_requests_total", replica=r, outcome="ok")
        for r in order] == expected, tolerate=(KeyError,))
    # a busy machine can take both out of the picks for a moment (a late engine scrape):
    # what counts is that they come back, not that they never left
    wait_until("both replicas back in the gateway's picks", lambda: metric(
        st.gateway.metrics(), "jitserve_gateway_replicas", state="ready") == 2)
    assert metric(st.gateway.metrics(), "jitserve_gateway_placement_seconds_count") == 4


def test_non_streamed_chat_and_other_routes_pass_through(
        fake: FakeVLLM, stack: StackFactory) -> None:
    st = stack([f"http://127.0.0.1:{fake.port}"] * 2)
    status, headers, doc = post(st.gateway.url + "/v1/completions", body(5))
    assert status == 200 and doc["usage"]["completion_tokens"] == 5, doc
    assert headers[REPLICA] in st.gateway.names
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    status, _, doc = post(st.gateway.url + "/v1/chat/completions", chat)
    assert status == 200 and doc["usage"]["completion_tokens"] == 3, doc
    content = doc["choices"][0]["message"]["content"]
    (result,) = asyncio.run(streams(st.gateway.url, [chat], path="/v1/chat/completions"))
    assert result.status == 200 and "".join(result.texts) == content, result
    status, doc = get_json(st.gateway.url + "/v1/models")
    assert status == 200 and doc["data"][0]["id"] == "fake-model"
    status, _, doc = post(st.gateway.url + "/tokenize", {"prompt": "abc"})
    assert status == 200 and doc["tokens"] == [97, 98, 99], doc


def test_a_sidecars_4xx_passes_through_unchanged(fake: FakeVLLM, stack: StackFactory) -> None:
    st = stack([f"http://127.0.0.1:{fake.port}"] * 2, api_keys={"key-a": "team-a"})
    bad = body(8, temperature="hot")
    for headers in ({}, {"Authorization": "Bearer wrong"},
                    {"Authorization": "Bearer key-a", "x-tenant": "team-b"},
                    {"Authorization": "Bearer key-a"}):
        direct = post(st.sidecars[0].url + "/v1/completions", {**bad, "stream": True}, headers)
        through = post(st.gateway.url + "/v1/completions", {**bad, "stream": True}, headers)
        assert direct[0] in (400, 401, 403)
        assert through[0] == direct[0] and through[2] == direct[2]
        for name in ("Content-Type", "x-should-retry"):
            assert through[1].get(name) == direct[1].get(name)
    status, _, _ = post(st.gateway.url + "/v1/completions", body(2),
                        {"Authorization": "Bearer key-a"})
    assert status == 200


def test_503_with_retry_after_when_no_replica_is_ready(fake: FakeVLLM, stack: StackFactory) -> None:
    st = stack([f"http://127.0.0.1:{fake.port}"] * 2)
    fake.kill()
    started = time.monotonic()
    wait_until("no replica in the picks", lambda: st.gateway.ready() == [])
    print(f"both out of the picks {time.monotonic() - started:.2f} s after vLLM died")
    status, headers, doc = post(st.gateway.url + "/v1/completions", body(4))
    assert status == 503 and int(headers["Retry-After"]) >= 1, doc
    assert doc["error"]["code"] == "no_replica"
    assert headers["x-llm-d-request-dropped-reason"] == "rejected-no-endpoints"
    assert get_json(st.gateway.admin_url + "/ready")[0] == 503
    fake.revive()
    wait_until("both back in the picks", lambda: len(st.gateway.ready()) == 2)
    assert post(st.gateway.url + "/v1/completions", body(4))[0] == 200


def test_429_with_retry_after_when_every_replica_sheds(stack: StackFactory) -> None:
    held = FakeVLLM(free_port(), interval_s=0.005, pause_at=1)
    try:
        policy = {"scheduler": {"preemption": {"enabled": False}},
                  "admission": {"queueCap": 1, "maxWaitingSeconds": 600}}
        # PATIENT: a late report would hide a replica from the picks a while, and
        # round-robin would put its request on the other one, past that one's queue cap
        st = stack([f"http://127.0.0.1:{held.port}"] * 2, policy, max_running=1,
                   gateway_args=("--placement", "round-robin", *PATIENT),
                   extra_args=["--stall-timeout", "600"])

        async def scenario() -> tuple[tuple[int, dict[str, str], Any], list[StreamResult]]:
            async with aiohttp.ClientSession() as session:
                tasks = []
                for n in range(4):  # a running and a waiting one on each replica
                    tasks.append(asyncio.create_task(
                        stream_completion(session, st.gateway.url, body(4))))
                    await asyncio.to_thread(
                        wait_until, f"{n + 1} requests in the sidecars",
                        lambda n=n: sum(s.state()["running"] + s.state()["waiting"]
                                        for s in st.sidecars) == n + 1)
                await asyncio.to_thread(wait_until, "both replicas reported shedding", lambda: all(
                    r["report"]["shedding"] for r in fleet_view(st).values()))
                async with session.post(st.gateway.url + "/v1/completions",
                                        json=body(4)) as resp:
                    refused = resp.status, dict(resp.headers), await resp.json()
                held.loop.call_soon_threadsafe(held.resume.set)
                return refused, list(await asyncio.gather(*tasks))

        (status, headers, doc), results = asyncio.run(scenario())
        assert status == 429 and int(headers["Retry-After"]) >= 1, doc
        assert doc["error"]["code"] == "all_replicas_shedding"
        assert headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"
        assert [len(r.token_ids) for r in results] == [4, 4, 4, 4]
    finally:
        held.close()


def test_in_flight_bound_answers_429(stack: StackFactory) -> None:
    held = FakeVLLM(free_port(), interval_s=0.005, pause_at=1)
    try:
        st = stack([f"http://127.0.0.1:{held.port}"] * 2,
                   gateway_args=("--max-in-flight", "2"), extra_args=["--stall-timeout", "600"])

        async def scenario() -> tuple[list[StreamResult], list[StreamResult]]:
            async with aiohttp.ClientSession() as session:
                tasks = [asyncio.create_task(stream_completion(session, st.gateway.url, body(3)))
                         for _ in range(2)]
                def open_or_ended() -> bool:
                    ended = [t for t in tasks if t.done()]
                    assert not ended, f"a held stream ended: {ended[0].result()}"
                    return sum(s.state()["running"] for s in st.sidecars) == 2

                await asyncio.to_thread(wait_until, "2 streams open", open_or_ended)
                # 10x the bound at once: every one refused at once, none queued
                refused = await asyncio.gather(*(
                    stream_completion(session, st.gateway.url, body(3)) for _ in range(20)))
                held.loop.call_soon_threadsafe(held.resume.set)
                return refused, list(await asyncio.gather(*tasks))

        refused, results = asyncio.run(scenario())
        for r in refused:
            assert r.status == 429 and r.error is not None, r
            assert r.error["code"] == "gateway_busy" and int(r.headers["Retry-After"]) >= 1
            assert r.headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"
        assert [len(r.token_ids) for r in results] == [3, 3]
        assert metric(st.gateway.metrics(), "jitserve_gateway_requests_total",
                      outcome="shed") == 20
    finally:
        held.close()


def raw_exchange(port: int, data: bytes, timeout_s: float = 60) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        answer = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            answer += chunk
        return answer


def test_the_doors_limits(fake: FakeVLLM, stack: StackFactory) -> None:
    st = stack([f"http://127.0.0.1:{fake.port}"] * 2, gateway_args=(
        "--max-body-bytes", "4096", "--body-timeout", "1", "--header-timeout", "1"))
    url = st.gateway.url + "/v1/completions"
    status, _, doc = post(url, {"prompt": "x" * 5000})
    assert status == 413 and doc["error"]["code"] == "request_too_large", doc
    status, _, doc = post(url, b'{"prompt": "hi", "stop": ' + b"[" * 40 + b"]" * 40 + b"}")
    assert status == 400 and doc["error"]["code"] == "too_deep", doc
    assert doc["error"]["param"].startswith("stop")
    # a body sent as a form (curl -d without a content type) is still read as JSON
    status, _, doc = post(url, b'{"prompt": "hi", "stop": ' + b"[" * 40 + b"]" * 40 + b"}",
                          {"content-type": "application/x-www-form-urlencoded"})
    assert status == 400 and doc["error"]["code"] == "too_deep", doc
    status, _, doc = post(url, b'{"prompt": ')
    assert status == 400 and doc["error"]["code"] == "invalid_json", doc
    answer = raw_exchange(st.gateway.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Type: application/json\r\nContent-Length: 500\r\n\r\n"
                          b'{"prompt": "hi"')
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    # headers never finished: the gateway closes the connection (recv returns b"")
    assert raw_exchange(st.gateway.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n") == b""
    assert fake.streams_started == 0  # none of them reached a replica


def test_a_failed_write_to_the_client_means_it_left() -> None:
    """aiohttp refuses a write to a closing transport (before the handler is cancelled)
    with its ClientConnectionResetError: the proxy reads that as the client leaving."""
    async def refused() -> None:
        raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")

    with pytest.raises(ClientLeft):
        asyncio.run(to_client(refused()))


@pytest.mark.parametrize("pause_at", [3, 200])
def test_a_client_leaving_cancels_the_request_in_its_sidecar(stack: StackFactory,
                                                             pause_at: int) -> None:
    """The gateway learns that the client left from its handler's cancellation or from a
    write that fails first (tokens still flowing: pause_at=200); both count it cancelled.
    The stream then stops for good, so it never ends on its own."""
    held = FakeVLLM(free_port(), interval_s=0.005, pause_at=pause_at)
    try:
        st = stack([f"http://127.0.0.1:{held.port}"] * 2, extra_args=["--stall-timeout", "600"])

        async def leave() -> str:
            async with aiohttp.ClientSession() as session:
                resp = await session.post(st.gateway.url + "/v1/completions",
                                          json={**body(500), "stream": True})
                assert resp.status == 200
                await resp.content.readline()  # the first token came through
                replica = resp.headers[REPLICA]
                resp.close()  # the client goes away mid-stream
                return replica

        replica = asyncio.run(leave())
        s = st.sidecar_of(replica)
        wait_until("the sidecar to drop the request", lambda: not s.state()["running"])
        assert metric(s.metrics(), "jitserve_requests_total", outcome="cancelled") == 1
        wait_until("the gateway to count it", lambda: metric(
            st.gateway.metrics(), "jitserve_gateway_requests_total", replica=replica,
            outcome="cancelled") == 1, tolerate=(KeyError,))
    finally:
        held.close()


def test_least_loaded_places_from_the_reports(stack: StackFactory) -> None:
    """Work sent to replica A behind the gateway's back shows in A's report (outstanding
    tokens); the gateway's least-loaded placement then sends new work to B."""
    held = FakeVLLM(free_port(), interval_s=0.005, pause_at=2)
    try:
        st = stack([f"http://127.0.0.1:{held.port}"] * 2, max_running=4,
                   gateway_args=("--placement", "least-loaded", *PATIENT),
                   extra_args=["--stall-timeout", "600"])
        busy, idle = st.name(0), st.name(1)

        async def scenario() -> list[str]:
            async with aiohttp.ClientSession() as session:
                behind = [asyncio.create_task(stream_completion(
                    session, st.sidecars[0].url, body(2000))) for _ in range(3)]
                def backlog() -> bool:
                    report = fleet_view(st)[busy]["report"]
                    return bool(report["running"] == 3 and report["outstanding_tokens"] >= 100)

                await asyncio.to_thread(wait_until, "A's backlog in the gateway's view", backlog)
                chosen = []
                for _ in range(2):
                    async with session.post(st.gateway.url + "/v1/completions",
                                            json=body(2)) as resp:
                        assert resp.status == 200
                        chosen.append(resp.headers[REPLICA])
                held.loop.call_soon_threadsafe(held.resume.set)
                await asyncio.gather(*behind)
                return chosen

        assert asyncio.run(scenario()) == [idle, idle]
    finally:
        held.close()


def test_a_large_non_streamed_answer_passes_whole(stack: StackFactory) -> None:
    wide = FakeVLLM(free_port(), interval_s=0.0, token_text_bytes=512)
    try:
        st = stack([f"http://127.0.0.1:{wide.port}"] * 2)
        status, _, doc = post(st.gateway.url + "/v1/completions", body(600))
        assert status == 200, doc
        assert doc["usage"]["completion_tokens"] == 600
        assert len(doc["choices"][0]["text"]) > 600 * 512  # ~300 KB: many TCP segments
    finally:
        wide.close()
