"""The sidecar's access log: one JSON line per answered request (owner: sidecar).

Off by default (``--access-log``). Each line is written when the answer ends (a stream
at its last event), so it carries how the request ended: method, path, status, bytes,
seconds, and for a scheduled request its id, tenant, SLO kind and class, outcome,
finish reason, prompt and completion tokens and preemptions. To standard output, apart
from the diagnostic log, whatever ``--log-level`` is.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from jitserve.sidecar.jobs import Job

JOB_KEY = web.RequestKey("jitserve_job", Job)
"""Where a completion handler leaves its request's job for the access log."""


def access_logger() -> logging.Logger:
    """``jitserve.access``: JSON lines to stdout, not mixed with the diagnostic format."""
    log = logging.getLogger("jitserve.access")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log


class JSONAccessLogger(AbstractAccessLogger):
    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        line: dict[str, Any] = {
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "remote": request.remote, "method": request.method, "path": request.path,
            "status": response.status, "bytes": response.body_length,
            "seconds": round(time, 6),
        }
        job = request.get(JOB_KEY) if isinstance(request, web.Request) else None
        if job is not None:
            req = job.live.req
            line.update(request_id=job.request_id, tenant=req.tenant, kind=req.kind.value,
                        slo_class=req.slo_class, outcome=job.outcome,
                        finish_reason=job.finish_reason,
                        prompt_tokens=len(job.prompt_ids),
                        completion_tokens=len(job.generated_ids),
                        preemptions=job.live.preemptions)
        self.logger.info(json.dumps(line))
