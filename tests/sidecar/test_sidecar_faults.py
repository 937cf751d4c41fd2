"""Fault injection: the backend dies mid-stream and comes back.

``DyingBackend`` is a FAKE vLLM (the only fake backend in this suite, as the issue
allows for this test): an OpenAI-compatible token streamer that can be killed (its
listening socket closed and every open stream cut) and restarted on the same port.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from sidecar_support import SidecarProcess, get_json, get_text, metric

from jitserve.bench.live import StreamResult, stream_completion

pytestmark = pytest.mark.timeout(180)


class DyingBackend:
    """FAKE backend: /health, /v1/models, /v1/completions streaming one token per
    ``interval_s``; ``kill()`` cuts every stream and stops listening, ``revive()``
    listens again on the same port."""

    def __init__(self, port: int, interval_s: float = 0.02) -> None:
        self.port = port
        self.interval_s = interval_s
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner: web.AppRunner | None = None
        self.streams_started = 0
        self.revive()

    def _app(self) -> web.Application:
        app = web.Application()
        app.add_routes(
            [
                web.get("/health", self.health),
                web.get("/v1/models", self.models),
                web.post("/v1/completions", self.completions),
            ]
        )
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        doc = await request.json()
        self.streams_started += 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = int(doc["max_tokens"])
        for i in range(n):
            await asyncio.sleep(self.interval_s)
            finish = '"length"' if i == n - 1 else "null"
            chunk = (
                f'{{"choices": [{{"index": 0, "text": "t{i} ", "token_ids": [{100 + i}], '
                f'"finish_reason": {finish}}}]}}'
            )
            await resp.write(f"data: {chunk}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def revive(self) -> None:
        async def start() -> web.AppRunner:
            runner = web.AppRunner(self._app(), shutdown_timeout=0.1)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", self.port, reuse_address=True).start()
            return runner

        self.runner = self._run(start())

    def kill(self) -> None:
        """Die: stop listening and cut every open connection mid-stream."""
        runner = self.runner
        assert runner is not None
        self.runner = None

        async def die() -> None:
            server = runner.server
            for site in list(runner.sites):
                await site.stop()
            if server is not None:
                for conn in list(server.connections):
                    if conn.transport is not None:
                        conn.transport.abort()
            await runner.cleanup()

        self._run(die())

    def close(self) -> None:
        if self.runner is not None:
            self.kill()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def test_backend_dying_mid_stream(tmp_path: Path) -> None:
    from jitserve.devstack.vllm import free_port

    fake = DyingBackend(free_port())
    config = tmp_path / "policy.yaml"
    config.write_text(yaml.safe_dump({"admission": {"maxWaitingSeconds": 120}}))
    s = SidecarProcess(f"http://127.0.0.1:{fake.port}", config=config, max_running=1)
    try:
        s.wait_ready()

        async def scenario() -> tuple[StreamResult, list[StreamResult], dict[str, Any]]:
            async with aiohttp.ClientSession() as session:

                def send(n: int) -> asyncio.Task[StreamResult]:
                    return asyncio.create_task(
                        stream_completion(session, s.url, {"prompt": [1, 2, 3], "max_tokens": n})
                    )

                victim = send(400)  # runs; dies with the backend
                while not s.state()["running"]:
                    await asyncio.sleep(0.01)
                queued = [send(10), send(12)]  # wait behind it
                while s.state()["waiting"] < 2:
                    await asyncio.sleep(0.01)
                while not any(r["generated"] >= 5 for r in s.state()["running_requests"]):
                    await asyncio.sleep(0.01)
                fake.kill()
                hit = await victim
                # the backend is down: not ready, new requests refused, the queue is kept
                deadline = time.monotonic() + 30
                while get_json(s.url + "/ready")[0] != 503:
                    assert time.monotonic() < deadline, "/ready stayed 200"
                    await asyncio.sleep(0.05)
                _, ready = get_json(s.url + "/ready")
                async with session.post(
                    s.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 3}
                ) as resp:
                    refused = {
                        "status": resp.status,
                        "retry_after": resp.headers.get("Retry-After"),
                        "body": await resp.json(),
                        "ready": ready,
                        "waiting": s.state()["waiting"],
                    }
                assert not any(t.done() for t in queued), "a queued request was dropped"
                await asyncio.sleep(1.0)
                assert not any(t.done() for t in queued), "a queued request was dropped"
                fake.revive()
                return hit, list(await asyncio.gather(*queued)), refused

        hit, served, refused = asyncio.run(scenario())
        # the affected client got the tokens produced so far, then a clear error event
        assert hit.status == 200 and 5 <= len(hit.token_ids) < 400
        assert hit.token_ids == list(range(100, 100 + len(hit.token_ids)))
        assert hit.finish_reason is None
        assert hit.error is not None and hit.error["code"] == "backend_failed"
        assert hit.error["type"] == "service_unavailable" and "message" in hit.error
        # while down: /ready false with the reason, new requests 503 + Retry-After, queue kept
        assert refused["ready"]["ready"] is False and refused["ready"]["reason"]
        assert refused["status"] == 503 and int(refused["retry_after"]) >= 1
        assert refused["body"]["error"]["code"] == "backend_unavailable"
        assert refused["waiting"] == 2
        # back up: the queued requests were served, in full
        assert [r.status for r in served] == [200, 200]
        assert [len(r.token_ids) for r in served] == [10, 12]
        assert all(r.error is None and r.finish_reason == "length" for r in served)
        status, ready = get_json(s.url + "/ready")
        assert status == 200 and ready["ready"] is True
        text = get_text(s.url + "/metrics")
        assert metric(text, "jitserve_requests_total", outcome="error") == 1
        assert metric(text, "jitserve_requests_total", outcome="met") == 2
        assert metric(text, "jitserve_backend_up") == 1
        assert metric(text, "jitserve_rejections_total", reason="backend_down") >= 1
        assert json.loads(json.dumps(s.state()))["waiting"] == 0
    finally:
        s.close()
        fake.close()
