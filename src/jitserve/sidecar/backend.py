"""The sidecar's client of the vLLM OpenAI server it fronts (owner: sidecar).

The sidecar speaks to vLLM in token ids only, so that a preempted request can resume
exactly where it stopped: prompts are tokenized once with vLLM's ``/tokenize`` (chat
messages through the model's chat template), and every dispatch is a streamed
``/v1/completions`` call with ``prompt`` = token ids, ``return_token_ids`` and vLLM's
``priority``, read by :class:`jitserve.sidecar.wire.TokenStream` (the token path: no
client library per token). Aborting a dispatch = closing its HTTP stream: vLLM aborts
the request on client disconnect (``AsyncLLM.generate`` -> ``abort`` on cancellation).
The rest (``/tokenize``, ``/v1/models``, health, forwarded requests) goes through one
aiohttp session.

Errors: :class:`BackendUnavailable` when vLLM cannot be reached or the stream breaks
(connection refused/reset, truncated stream, engine dead: HTTP 5xx, or a 5xx error event
inside the stream); :class:`BackendStalled` (a kind of it) when a stream whose tokens
were flowing sends nothing for ``stall_timeout_s``; :class:`BackendError` for what vLLM
says about the request itself: a 4xx answer, or a 4xx error event inside a 200 stream
(vLLM validates token ids and sampling parameters only once the stream has started). Only
the first two mean "the backend is down"; a :class:`BackendError` concerns one request.

:meth:`VLLMBackend.forward` is the other way in: a request using what only vLLM's own
endpoints honour (structured outputs, tools, logprobs, ``n``) is sent to
``/v1/chat/completions`` or ``/v1/completions`` as the client wrote it, and its chunks
(or whole body) come back as vLLM wrote them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp

from jitserve import sse
from jitserve.sidecar.upstream import (
    BackendError,
    BackendStalled,
    BackendUnavailable,
    error_message,
    stream_error,
)
from jitserve.sidecar.watch import StallWatch
from jitserve.sidecar.wire import DispatchSink, TokenStream, request_bytes

log = logging.getLogger("jitserve.sidecar")

STALE_RETRIES = 2
"""Sends again of one request whose pooled connection broke before any answer."""


class Abortable(Protocol):
    def abort(self) -> None:
        """End the stream now, calling nothing back; vLLM aborts the request."""


class Backend(Protocol):
    """What the dispatcher needs of vLLM (:class:`VLLMBackend` is the real one)."""

    base_url: str

    def open_stream(self, model: str, prompt_ids: list[int], max_tokens: int,
                    sampling: dict[str, Any], priority: int, request_id: str,
                    sink: DispatchSink) -> Abortable: ...

    async def health(self) -> bool: ...

    async def models(self) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class VLLMBackend:
    """One shared connection pool toward one vLLM server."""

    def __init__(self, base_url: str, connect_timeout_s: float = 3.0,
                 request_timeout_s: float = 30.0, stall_timeout_s: float | None = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        if urlsplit(self.base_url).scheme != "http":
            raise ValueError(f"the model backend must be a plain http:// URL (vLLM in the "
                             f"pod, on loopback), got {base_url!r}")
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.stall_timeout_s = stall_timeout_s or None
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # below vLLM's own keep-alive (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s): a connection
            # the server already closed must never be reused for a dispatch
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=3)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(self, method: str, path: str, body: dict[str, Any] | None,
                       headers: dict[str, str], timeout: aiohttp.ClientTimeout,
                       ) -> aiohttp.ClientResponse:
        """Send one request; again when a pooled connection broke before any answer
        came (vLLM closed it while idle, or never read the request): vLLM either never
        got the request or aborts it on the disconnect, so nothing runs twice. Each
        broken connection leaves the pool, so the tries end on a fresh one. A connect
        that timed out is tried again too: nothing was sent, and on a starved machine the
        connect's timer can fire before the event loop sees the connection made."""
        url = self.base_url + path
        for _ in range(STALE_RETRIES):
            try:
                return await self.session.request(method, url, json=body, headers=headers,
                                                  timeout=timeout)
            except aiohttp.ConnectionTimeoutError as err:
                log.info("%s %s: no connection within %g s (%s); trying again", method, path,
                         self.connect_timeout_s, err)
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as err:
                if isinstance(err, aiohttp.ClientConnectorError):
                    raise  # vLLM refuses connections: down, not a stale connection
                log.info("%s %s: a pooled connection broke (%s); sending again", method,
                         path, err)
        try:
            return await self.session.request(method, url, json=body, headers=headers,
                                              timeout=timeout)
        except aiohttp.ConnectionTimeoutError as err:  # a TimeoutError: not a stall
            raise BackendUnavailable(f"{path}: no connection to the model backend within "
                                     f"{self.connect_timeout_s:g} s") from err

    def _stalled(self) -> BackendStalled:
        return BackendStalled(f"no data from the model backend for {self.stall_timeout_s:g} s "
                              "(stall timeout)")

    async def _json(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s,
                                        sock_connect=self.connect_timeout_s)
        try:
            async with await self._request(method, path, body, {}, timeout) as resp:
                data = await resp.read()
                if resp.status >= 500:
                    raise BackendUnavailable(f"{path}: HTTP {resp.status}")
                if resp.status >= 400:
                    message, param = error_message(resp.status, data)
                    raise BackendError(resp.status, message, param)
                return json.loads(data)
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as err:
            raise BackendUnavailable(f"{path}: {type(err).__name__}: {err}") from err

    async def health(self) -> bool:
        timeout = aiohttp.ClientTimeout(total=5.0, sock_connect=2.0)
        try:
            async with self.session.get(self.base_url + "/health", timeout=timeout) as resp:
                await resp.read()
                return resp.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    async def models(self) -> dict[str, Any]:
        doc = await self._json("GET", "/v1/models")
        if not isinstance(doc, dict):
            raise BackendUnavailable("/v1/models: unexpected body")
        return doc

    async def tokenize(
        self, model: str, *, prompt: str | None = None,
        messages: list[dict[str, Any]] | None = None,
    ) -> tuple[list[int], int | None]:
        """Token ids of a prompt (or of chat messages with the generation prompt) and the
        model's maximum context length."""
        body: dict[str, Any] = {"model": model}
        if messages is not None:
            body.update(messages=messages, add_generation_prompt=True)
        else:
            body["prompt"] = prompt
        doc = await self._json("POST", "/tokenize", body)
        tokens = doc.get("tokens") if isinstance(doc, dict) else None
        if not isinstance(tokens, list):
            raise BackendUnavailable("/tokenize: unexpected body")
        max_len = doc.get("max_model_len")
        return [int(t) for t in tokens], int(max_len) if isinstance(max_len, int) else None

    def open_stream(self, model: str, prompt_ids: list[int], max_tokens: int,
                    sampling: dict[str, Any], priority: int, request_id: str,
                    sink: DispatchSink) -> Abortable:
        """Start one dispatch (a :class:`jitserve.sidecar.wire.TokenStream`): its chunks
        and its end go to ``sink``; ``abort()`` on the result aborts it in vLLM.

        Stall timeout: the answer's head must come within ``stall_timeout_s`` (vLLM sends
        it at once, queued or not), and once tokens flow, each next read too; else
        :class:`BackendStalled`. Before the first token there is no bound: the request
        may wait in vLLM's own queue or prefill (health checks watch vLLM meanwhile)."""
        body = {
            **sampling,
            "model": model,
            "prompt": prompt_ids,
            "max_tokens": max_tokens,
            "stream": True,
            "return_token_ids": True,
            "priority": priority,
            "request_id": request_id,
        }
        url = urlsplit(self.base_url)
        host, port = url.hostname or "127.0.0.1", url.port or 80
        stream = TokenStream(sink, request_bytes(url.netloc, url.path + "/v1/completions", body,
                                                 {"X-Request-Id": request_id}),
                             self.stall_timeout_s)
        stream.open(host, port, self.connect_timeout_s)
        return stream

    async def forward(self, path: str, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Send ``body`` to vLLM's ``path`` as is; yield each SSE chunk of a streamed
        request, or the one body of a non-streamed one. Errors as :meth:`stream`;
        closing the generator early aborts the request in vLLM."""
        if body.get("stream"):
            async for doc in self._post_sse(path, body, {},
                                            lambda doc: bool(doc.get("choices"))):
                yield doc
            return
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s)
        try:
            async with await self._request("POST", path, body, {}, timeout) as resp:
                data = await resp.read()
                if resp.status >= 500:
                    raise BackendUnavailable(f"{path}: HTTP {resp.status}")
                if resp.status != 200:
                    message, param = error_message(resp.status, data)
                    raise BackendError(resp.status, message, param)
            doc = json.loads(data)
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as err:
            raise BackendUnavailable(f"{path}: {type(err).__name__}: {err}") from err
        yield doc

    async def _post_sse(self, path: str, body: dict[str, Any], headers: dict[str, str],
                        flowing: Callable[[dict[str, Any]], bool],
                        ) -> AsyncIterator[dict[str, Any]]:
        """POST a streamed request and yield each SSE event's JSON until ``[DONE]``.

        Stall timeout: the answer's head must come within ``stall_timeout_s`` (vLLM sends
        it at once, queued or not), and once ``flowing`` says tokens flow, each next read
        too; else :class:`BackendStalled`. Before that there is no bound: the request may
        wait in vLLM's own queue or prefill (health checks watch vLLM meanwhile). Closing
        the generator early drops the connection: vLLM aborts the request."""
        finished = False
        stall = self.stall_timeout_s
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s)
        try:
            async with asyncio.timeout(stall):
                resp = await self._request("POST", path, body, headers, timeout)
        except TimeoutError as err:
            raise self._stalled() from err
        except (aiohttp.ClientError, OSError) as err:
            raise BackendUnavailable(f"{path}: {type(err).__name__}: {err}") from err
        watch = StallWatch(stall)  # one lazily re-armed timer, not one per read
        try:
            if resp.status != 200:
                data = await resp.read()
                if resp.status >= 500:
                    raise BackendUnavailable(f"{path}: HTTP {resp.status}")
                message, param = error_message(resp.status, data)
                raise BackendError(resp.status, message, param)
            # Parse whole reads, not lines: one pass per network read, however many
            # events it holds (vLLM writes "data: {...}\n\n" per step and request).
            buffer = b""
            flows = False
            while not finished:
                if flows:
                    watch.arm()
                try:
                    data = await resp.content.readany()
                except asyncio.CancelledError:
                    if watch.expired():
                        raise self._stalled() from None
                    raise
                finally:
                    watch.disarm()
                if not data:
                    break
                buffer += data
                events, buffer = sse.split(buffer)
                for event in events:
                    payload = sse.data(event)
                    if payload is None:
                        continue
                    if payload == sse.DONE:
                        finished = True
                        break
                    doc = json.loads(payload)
                    if "error" in doc:
                        raise stream_error(doc["error"])
                    flows = flows or flowing(doc)
                    yield doc
            if not finished:
                raise BackendUnavailable("backend stream ended before [DONE]")
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as err:
            raise BackendUnavailable(
                f"backend stream broke: {type(err).__name__}: {err}") from err
        finally:
            watch.close()
            if finished:
                resp.release()
            else:
                resp.close()  # drop the connection: vLLM aborts the request
