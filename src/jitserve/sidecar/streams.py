"""Reading vLLM's streams for the dispatcher (owner: sidecar).

:meth:`StreamRunner.generate` starts a dispatch on the token-id path (a streamed
``/v1/completions`` call that a preemption may abort and a later dispatch resumes), heard
by a :class:`TokenDispatch` in the event loop's callbacks, no coroutine per dispatch;
:meth:`StreamRunner.forward` is one coroutine per request forwarded to vLLM's own
endpoint as the client sent them. Chunks of a stale dispatch (one that was preempted or ended) are
dropped. A failure ends only its request: a transport failure also marks the backend not
ready; a request vLLM refused (4xx) leaves it up.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol, cast

from jitserve.sidecar import passthrough
from jitserve.sidecar.backend import Abortable, Backend
from jitserve.sidecar.errors import APIError, backend_rejected
from jitserve.sidecar.health import BackendHealth
from jitserve.sidecar.jobs import Job
from jitserve.sidecar.upstream import BackendError, BackendUnavailable

log = logging.getLogger("jitserve.sidecar")


class StreamSink(Protocol):
    """What a stream reports to (:class:`jitserve.sidecar.dispatcher.Dispatcher`)."""

    backend: Backend
    health: BackendHealth

    def on_tokens(self, job: Job, ids: list[int], text: str,
                  raw: dict[str, Any] | None = None) -> None: ...

    def finish(self, job: Job, finish_reason: str) -> None: ...

    def fail(self, job: Job, error: APIError) -> None: ...


class TokenDispatch:
    """One dispatch on the token-id path, as :class:`jitserve.sidecar.wire.TokenStream`'s
    sink: its chunks are the request's tokens until a preemption or an ending makes the
    dispatch stale (``job.segment`` moved on), then nothing it says counts."""

    __slots__ = ("finish", "job", "runner", "segment")

    def __init__(self, runner: StreamRunner, job: Job, segment: int) -> None:
        self.runner, self.job, self.segment = runner, job, segment
        self.finish: str | None = None

    def on_chunk(self, token_ids: list[int], text: str, finish_reason: str | None) -> None:
        job = self.job
        if job.segment != self.segment:
            return
        if token_ids or text:
            self.runner.engine.on_tokens(job, token_ids, text)
        if finish_reason is not None:
            self.finish = finish_reason

    def on_end(self, error: Exception | None) -> None:
        job = self.job
        if job.segment != self.segment:
            return
        if error is None and self.finish is None:
            error = BackendUnavailable("backend stream ended without a finish reason")
        if error is not None:
            self.runner.failed(job, self.segment, error)
            return
        try:
            self.runner.engine.finish(job, self.finish or "stop")
        except Exception as err:  # a bug must not leave a client hanging
            self.runner.failed(job, self.segment, err)


class ForwardTask:
    """A forwarded request's coroutine, aborted by cancelling it (from outside)."""

    __slots__ = ("task",)

    def __init__(self, task: asyncio.Task[None]) -> None:
        self.task = task

    def abort(self) -> None:
        if self.task is not asyncio.current_task():
            self.task.cancel()


class StreamRunner:
    def __init__(self, engine: StreamSink) -> None:
        self.engine = engine

    def generate(self, job: Job, segment: int, prompt: list[int], max_tokens: int,
                 sampling: dict[str, Any], priority: int) -> Abortable:
        """Start ``job``'s dispatch number ``segment``; abort the result to end it."""
        return self.engine.backend.open_stream(
            job.model, prompt, max_tokens, sampling, priority, f"{job.request_id}-{segment}",
            TokenDispatch(self, job, segment))

    async def forward(self, job: Job, segment: int) -> None:
        """A forwarded request: vLLM's chunks (or body) to the client as they come, their
        tokens counted for scheduling and goodput."""
        assert job.forward is not None
        body = passthrough.vllm_body(job.forward, job.model, job.vllm_priority,
                                     f"{job.request_id}-{segment}")
        finish: str | None = None
        try:
            forwarder = cast(passthrough.Forwarder, self.engine.backend)
            async for doc in forwarder.forward(job.forward_path, body):
                if job.segment != segment:
                    return
                n = passthrough.tokens_in(doc, len(job.generated_ids))
                self.engine.on_tokens(job, [0] * n, "", doc)
                finish = passthrough.finish_reason(doc) or finish
            if job.segment == segment:
                self.engine.finish(job, finish or "stop")
        except asyncio.CancelledError:
            raise
        except Exception as err:
            self.failed(job, segment, err)

    def failed(self, job: Job, segment: int, err: Exception) -> None:
        """End ``job`` after its stream failed (backend down, request refused, a bug)."""
        if isinstance(err, BackendUnavailable):
            if job.segment == segment and not job.done:
                log.warning("request %s: backend failed mid-stream: %s", job.request_id, err)
                self.engine.fail(job, APIError(503, f"the model backend failed mid-stream: {err}",
                                        type_="service_unavailable", code="backend_failed",
                                        retry_after_s=2))
                self.engine.health.set(False, str(err))
        elif isinstance(err, BackendError):  # about this request only: the backend stays up
            if job.segment == segment and not job.done:
                self.engine.fail(job, backend_rejected(err.status, err.message, err.param))
        else:  # a bug must not leave a client hanging
            log.exception("request %s: unexpected error", job.request_id)
            if job.segment == segment and not job.done:
                self.engine.fail(job, APIError(500, f"internal error: {err}", type_="server_error"))

