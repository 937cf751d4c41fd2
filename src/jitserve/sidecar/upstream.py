"""What vLLM's answers mean to the sidecar: its errors, named (owner: sidecar).

Only :class:`BackendUnavailable` (and :class:`BackendStalled`, a kind of it) means "the
backend is down"; a :class:`BackendError` concerns one request.
"""

from __future__ import annotations

import json
from typing import Any


class BackendUnavailable(Exception):
    """vLLM is down, unreachable, or failed mid-stream."""


class BackendStalled(BackendUnavailable):
    """A running stream sent nothing for the stall timeout (vLLM frozen or wedged)."""


class BackendError(Exception):
    """vLLM rejected the request (4xx); ``status``, ``message`` and ``param`` come from
    its error body (``param`` as vLLM names it: ``prompt`` is the token ids we sent)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def stream_error(problem: Any) -> BackendError | BackendUnavailable:
    """What an ``{"error": ...}`` event inside a vLLM stream means: vLLM puts the HTTP
    status it would have answered in ``code``; a 4xx is about this request only."""
    if not isinstance(problem, dict):
        return BackendUnavailable(f"backend stream error: {problem}")
    message = str(problem.get("message") or problem)
    code = problem.get("code")
    status = int(code) if isinstance(code, int) or (isinstance(code, str) and code.isdigit()) \
        else 0
    if 400 <= status < 500:
        param = problem.get("param")
        return BackendError(status, message, str(param) if param else None)
    return BackendUnavailable(f"backend stream error: {message}")


def error_message(status: int, body: bytes) -> tuple[str, str | None]:
    try:
        doc = json.loads(body)
        err = doc.get("error", doc) if isinstance(doc, dict) else {}
        if isinstance(err, dict):
            return str(err.get("message") or body[:500].decode(errors="replace")), err.get("param")
    except ValueError:
        pass
    return f"backend answered HTTP {status}: {body[:500].decode(errors='replace')}", None
