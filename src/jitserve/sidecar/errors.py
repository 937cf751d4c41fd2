"""OpenAI-shaped API errors of the sidecar (owner: sidecar).

Every error body the sidecar writes has OpenAI's shape::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "slo.ttft_ms",
               "code": "invalid_value"}}

``param`` names the offending field for 400s and ``code`` is always set, so a client can
act on it without parsing the message. Server faults never show a traceback: they are
a 500 ``internal_error`` with a one-line message.
"""

from __future__ import annotations

import re
from typing import Any

# Request fields vLLM may name in a message without setting ``param`` (longest first, so
# ``stop_token_ids`` is found before ``stop``).
_FIELDS = sorted((
    "stop_token_ids", "max_tokens", "min_tokens", "temperature", "top_p", "top_k", "min_p",
    "seed", "stop", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output",
    "ignore_eos", "prompt", "messages", "model",
), key=len, reverse=True)
_FIELD_RE = re.compile(r"\b(" + "|".join(_FIELDS) + r")\b")


FINAL_CODES = frozenset({"slo_unreachable", "client_too_slow", "internal_error"})
"""5xx codes a retry of the same request cannot fix: its SLO cannot be met under this
load, its reader is too slow, a bug."""


DROPPED_REASON = "x-llm-d-request-dropped-reason"
"""llm-d's response header naming why a request never reached an engine
(``pkg/epp/handlers/error``), on 429s and 503s alike, so a client or an SRE dashboard
tells a full pool from an empty one without parsing the body."""
SATURATED = "rejected-saturated"
NO_ENDPOINTS = "rejected-no-endpoints"
TTL_EXPIRED = "rejected-ttl-expired"
SHUTTING_DOWN = "rejected-shutting-down"


class APIError(Exception):
    """An HTTP error with an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
        dropped_reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s
        self.dropped_reason = dropped_reason
        """llm-d's reason for a request refused before it reached the engine
        (:data:`DROPPED_REASON`), sent beside the status."""

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    @property
    def retryable(self) -> bool:
        """Whether the same request may succeed if sent again (408, 409, 429 and
        5xx but those of :data:`FINAL_CODES`); clients (the ``openai`` SDK) read it
        from ``x-should-retry``."""
        if self.status in (408, 409, 429):
            return True
        return self.status >= 500 and self.code not in FINAL_CODES

    def headers(self) -> dict[str, str]:
        out = {"x-should-retry": "true" if self.retryable else "false"}
        if self.retry_after_s is not None:
            out["Retry-After"] = str(max(1, int(self.retry_after_s)))
        if self.dropped_reason is not None:
            out[DROPPED_REASON] = self.dropped_reason
        return out


def bad_request(param: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, f"{param}: {message}", param=param, code=code)


def queue_full(retry_after_s: int, message: str = "the request queue is full",
               code: str = "queue_full", dropped_reason: str = SATURATED) -> APIError:
    """429 + ``Retry-After``: shed for load (``code`` says why)."""
    return APIError(429, message, type_="rate_limit_error", code=code,
                    retry_after_s=retry_after_s, dropped_reason=dropped_reason)


def ttl_expired(ttl_s: float, retry_after_s: int) -> APIError:
    """429: the request's queue TTL (``x-llm-d-inference-ttl``) ran out before it was
    sent to the engine."""
    return queue_full(retry_after_s, f"not started within its queue TTL of {ttl_s:g} s "
                      "(x-llm-d-inference-ttl)", code="ttl_expired", dropped_reason=TTL_EXPIRED)


def backend_down(retry_after_s: int = 2,
                 message: str = "the model backend is unavailable") -> APIError:
    return APIError(503, message, type_="service_unavailable", code="backend_unavailable",
                    retry_after_s=retry_after_s, dropped_reason=NO_ENDPOINTS)


def backend_rejected(status: int, message: str, param: str | None = None) -> APIError:
    """vLLM refused one request (a 4xx, before or inside its stream): the client's fault,
    passed on as a 400-class error naming the field; other tenants are not affected."""
    if param is None:
        found = _FIELD_RE.search(message)
        if found is not None:
            param = found.group(1)
        elif "token id" in message.lower():
            param = "prompt"
    status = status if 400 <= status < 500 and status not in (401, 403, 404) else 400
    return APIError(status, f"{param}: {message}" if param else message, param=param,
                    code="invalid_value")


def internal_error(message: str = "internal error") -> APIError:
    return APIError(500, message, type_="server_error", code="internal_error")


def request_timeout(seconds: float) -> APIError:
    return APIError(408, f"the request body did not arrive within {seconds:g} s",
                    param="body", code="request_timeout")


def auth_unavailable(reason: str) -> APIError:
    """Keys are configured but none could be loaded: refuse, never serve without a key."""
    return APIError(503, f"authentication is unavailable: {reason}",
                    type_="service_unavailable", code="auth_unavailable", retry_after_s=5)


def shutting_down(who: str = "the sidecar") -> APIError:
    return APIError(503, f"{who} is shutting down", type_="service_unavailable",
                    code="shutting_down", retry_after_s=2, dropped_reason=SHUTTING_DOWN)


def slow_reader(limit: int) -> APIError:
    return APIError(503, f"the client read too slowly: over {limit} tokens were waiting to be "
                    "sent, so the request was aborted", type_="service_unavailable",
                    code="client_too_slow", retry_after_s=1)
