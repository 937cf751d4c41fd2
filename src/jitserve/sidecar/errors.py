"""OpenAI-shaped API errors of the sidecar (owner: sidecar).

Every error body the sidecar writes has OpenAI's shape::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "slo.ttft_ms",
               "code": "invalid_value"}}

``param`` names the offending field for 400s, as the issue asks.
"""

from __future__ import annotations

from typing import Any


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
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def headers(self) -> dict[str, str]:
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, int(self.retry_after_s)))}


def bad_request(param: str, message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, f"{param}: {message}", param=param, code=code)


def queue_full(retry_after_s: int, message: str = "the request queue is full") -> APIError:
    return APIError(429, message, type_="rate_limit_error", code="queue_full",
                    retry_after_s=retry_after_s)


def backend_down(retry_after_s: int = 2,
                 message: str = "the model backend is unavailable") -> APIError:
    return APIError(503, message, type_="service_unavailable", code="backend_unavailable",
                    retry_after_s=retry_after_s)
