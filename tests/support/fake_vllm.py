"""FAKE vLLM for the tests that need what the real one cannot show on demand (owner:
sidecar): a backend that dies and comes back on the same port, and a fast token source
for the fuzz suite (thousands of requests in seconds). Everything else runs against the
real CPU vLLM.

``FakeVLLM`` speaks the slice of vLLM's OpenAI server the sidecar uses: ``/health``,
``/v1/models``, ``/tokenize`` (one id per byte), and streamed ``/v1/completions`` on token
ids with ``return_token_ids``. Like vLLM 0.32 it validates token ids only once the
stream has started: an id outside the vocabulary (or a bad ``stop_token_ids``) is an
``{"error": {..., "code": 400}}`` event inside a 200 stream.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aiohttp import web

from jitserve import sse

VOCAB = 1000
MAX_MODEL_LEN = 4096


class FakeVLLM:
    """FAKE backend on 127.0.0.1:``port`` in its own thread and event loop."""

    def __init__(self, port: int, interval_s: float = 0.02, token_text_bytes: int = 0,
                 first_token_delay_s: float = 0.0, pause_at: int | None = None,
                 burst: bool = False) -> None:
        self.port = port
        self.interval_s = interval_s
        # burst: a stream's tokens in one write (up to the pause, then the rest): no gap
        # between two tokens that a busy machine could stretch past a stall timeout
        self.burst = burst
        self.first_token_delay_s = first_token_delay_s  # as if queued inside vLLM
        self.pause_at = pause_at  # after this many tokens, go silent (a frozen engine)
        self.resume = asyncio.Event()
        self.pad = "x" * token_text_bytes  # a long text per token: more bytes per event
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner: web.AppRunner | None = None
        self.streams_started = 0
        self.revive()

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 24)
        app.add_routes(
            [
                web.get("/health", self.health),
                web.get("/v1/models", self.models),
                web.post("/tokenize", self.tokenize),
                web.post("/v1/completions", self.completions),
                web.post("/v1/chat/completions", self.forwarded),
            ]
        )
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})

    @staticmethod
    def _bad(message: str, param: str | None = None) -> web.Response:
        body = {"error": {"message": message, "type": "BadRequestError", "param": param,
                          "code": 400}}
        return web.json_response(body, status=400)

    async def tokenize(self, request: web.Request) -> web.Response:
        doc = await request.json()
        if "messages" in doc:
            parts = []
            for m in doc["messages"]:
                content = m.get("content")
                if isinstance(content, list):
                    content = " ".join(str(p.get("text", "")) for p in content
                                       if isinstance(p, dict))
                if content is not None and not isinstance(content, str):
                    return self._bad("content must be a string or a list", "messages")
                parts.append(f"<{m.get('role')}>{content or ''}")
            text = "".join(parts) + "<assistant>"
        else:
            text = doc.get("prompt")
            if not isinstance(text, str):
                return self._bad("prompt must be a string", "prompt")
        tokens = list(text.encode("utf-8"))
        return web.json_response({"tokens": tokens, "count": len(tokens),
                                  "max_model_len": MAX_MODEL_LEN})

    def _check(self, doc: dict[str, Any]) -> str | None:
        for t in doc["prompt"] if isinstance(doc.get("prompt"), list) else []:
            if not isinstance(t, int):
                return "prompt must be token ids or a string"
            if not 0 <= t < VOCAB:
                return f"Token id {t} is out of vocabulary"
        stop = doc.get("stop_token_ids") or []
        if not isinstance(stop, list) or not all(isinstance(t, int) and 0 <= t < VOCAB
                                                 for t in stop):
            return "stop_token_ids must contain only token ids of the vocabulary"
        return None

    async def forwarded(self, request: web.Request) -> web.StreamResponse:
        """A request the sidecar forwards as the client sent it (chat, or a completion
        that is not streamed): like vLLM, one body, or chunks of its own shape."""
        doc = await request.json()
        chat = request.path.endswith("/chat/completions")
        n = doc.get("max_tokens") or 4
        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 4096:
            return self._bad("max_tokens must be a positive integer", "max_tokens")
        self.streams_started += 1
        head = {"id": "fake", "object": "chat.completion" if chat else "text_completion",
                "created": 0, "model": "fake-model"}
        usage = {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}
        if not doc.get("stream"):
            out = {"message": {"role": "assistant", "content": "t" * n}} if chat else \
                {"text": "t" * n}
            return web.json_response({**head, "choices": [
                {"index": 0, **out, "finish_reason": "length"}], "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(n):
            part = {"delta": {"content": "t"}} if chat else {"text": "t"}
            chunk = {**head, "choices": [{"index": 0, **part,
                                          "finish_reason": "length" if i == n - 1 else None}]}
            await resp.write(sse.json_event(chunk).encode())
        await resp.write((sse.json_event({**head, "choices": [], "usage": usage})
                          + sse.LAST).encode())
        return resp

    async def completions(self, request: web.Request) -> web.StreamResponse:
        doc = await request.json()
        if not doc.get("stream"):
            return await self.forwarded(request)
        temperature = doc.get("temperature", 1.0)
        if not isinstance(temperature, int | float) or isinstance(temperature, bool):
            return self._bad("temperature must be a number", "temperature")
        self.streams_started += 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        problem = self._check(doc)
        if problem is not None:  # like vLLM: a 400 inside the 200 stream
            error = {"error": {"message": problem, "type": "BadRequestError", "param": None,
                               "code": 400}}
            await resp.write(sse.error_ending(error).encode())
            return resp
        n = int(doc.get("max_tokens") or 4)
        await asyncio.sleep(self.first_token_delay_s)
        held = b""  # burst: the events not written yet
        for i in range(n):
            if not self.burst:
                await asyncio.sleep(self.interval_s)
            if i == self.pause_at:
                if held:
                    await resp.write(held)
                    held = b""
                await self.resume.wait()
            finish = '"length"' if i == n - 1 else "null"
            chunk = (
                f'{{"choices": [{{"index": 0, "text": "t{i}{self.pad} ", '
                f'"token_ids": [{100 + i % 800}], '
                f'"finish_reason": {finish}}}]}}'
            )
            held += sse.event(chunk).encode()
            if not self.burst:
                await resp.write(held)
                held = b""
        await resp.write(held + sse.LAST.encode())
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
