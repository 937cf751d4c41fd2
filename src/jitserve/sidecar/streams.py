"""Reading vLLM's streams for the dispatcher (owner: sidecar).

One coroutine per dispatch: :meth:`StreamRunner.generate` for the token-id path (a
streamed ``/v1/completions`` call that a preemption may close and a later dispatch
resumes), :meth:`StreamRunner.forward` for requests forwarded to vLLM's own endpoint as
the client sent them. Chunks of a stale dispatch (one that was preempted or ended) are
dropped. A failure ends only its request: a transport failure also marks the backend not
ready; a request vLLM refused (4xx) leaves it up.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol, cast

from jitserve.sidecar import passthrough
from jitserve.sidecar.backend import Backend, BackendError, BackendUnavailable
from jitserve.sidecar.errors import APIError, backend_rejected
from jitserve.sidecar.health import BackendHealth
from jitserve.sidecar.jobs import Job

log = logging.getLogger("jitserve.sidecar")


class StreamSink(Protocol):
    """What a stream reports to (:class:`jitserve.sidecar.dispatcher.Dispatcher`)."""

    backend: Backend
    health: BackendHealth

    def on_tokens(self, job: Job, ids: list[int], text: str,
                  raw: dict[str, Any] | None = None) -> None: ...

    def finish(self, job: Job, finish_reason: str) -> None: ...

    def fail(self, job: Job, error: APIError) -> None: ...


class StreamRunner:
    def __init__(self, engine: StreamSink) -> None:
        self.engine = engine

    async def generate(self, job: Job, segment: int, prompt: list[int], max_tokens: int,
                          sampling: dict[str, Any], priority: int) -> None:
        finish: str | None = None
        try:
            async for chunk in self.engine.backend.stream(job.model, prompt, max_tokens, sampling,
                                                   priority, f"{job.request_id}-{segment}"):
                if job.segment != segment:
                    return
                if chunk.token_ids or chunk.text:
                    self.engine.on_tokens(job, chunk.token_ids, chunk.text)
                if chunk.finish_reason is not None:
                    finish = chunk.finish_reason
            if job.segment != segment:
                return
            if finish is None:
                raise BackendUnavailable("backend stream ended without a finish reason")
            self.engine.finish(job, finish)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            self.failed(job, segment, err)

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

