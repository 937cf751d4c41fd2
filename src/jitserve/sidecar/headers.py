"""The request headers gateways send, current names first (owner: sidecar).

llm-d's router (``pkg/epp/metadata/consts.go``) names the tenant
``x-llm-d-inference-fairness-id``, the objective ``x-llm-d-inference-objective`` and the
latency targets ``x-llm-d-slo-ttft-ms`` / ``x-llm-d-slo-tpot-ms``; the names before them
(``x-gateway-inference-*``, ``x-slo-ttft-ms``, ``x-slo-tpot-ms``) are its deprecated
aliases, and the sidecar reads them as such. llm-d has no deadline or class header: jitserve's
own are named in the same ``x-llm-d-slo-*`` family (``x-llm-d-slo-deadline-ms``,
``x-llm-d-slo-class``), so a gateway that strips or forwards that family treats them as it
treats the latency targets; their first names (``x-slo-deadline-ms``, ``x-slo-class``,
``x-slo-tbt-ms``) stay aliases. The current name wins when a request sends both.

:func:`lookup` returns a header's value with the name the client used (error messages
name that one).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from jitserve.sidecar.errors import bad_request

FAIRNESS_ID = "x-llm-d-inference-fairness-id"
OBJECTIVE = "x-llm-d-inference-objective"
SLO_TTFT = "x-llm-d-slo-ttft-ms"
SLO_TPOT = "x-llm-d-slo-tpot-ms"
SLO_DEADLINE = "x-llm-d-slo-deadline-ms"
SLO_CLASS = "x-llm-d-slo-class"
INFERENCE_TTL = "x-llm-d-inference-ttl"
"""llm-d's queue TTL for one request, a Go duration (``1500ms``, ``2s``, ``1m30s``): how
long it may wait before it is sent to the engine (:func:`queue_ttl_s`)."""
TENANT = "x-tenant"
"""jitserve's own tenant header (no gateway): read before the fairness id."""

ALIASES: dict[str, tuple[str, ...]] = {
    FAIRNESS_ID: ("x-gateway-inference-fairness-id",),
    OBJECTIVE: ("x-gateway-inference-objective",),
    SLO_TTFT: ("x-slo-ttft-ms",),
    SLO_TPOT: ("x-slo-tpot-ms", "x-slo-tbt-ms"),
    SLO_DEADLINE: ("x-slo-deadline-ms",),
    SLO_CLASS: ("x-slo-class",),
}
"""Current name -> its deprecated aliases, in the order they are read."""


def names(key: str) -> tuple[str, ...]:
    """``key`` followed by its deprecated aliases."""
    return (key, *ALIASES.get(key, ()))


def lookup(headers: Mapping[str, str], key: str) -> tuple[str, str] | None:
    """(the name sent, its value) of the first of ``key`` and its aliases the request
    carries, or None."""
    for name in names(key):
        value = headers.get(name)
        if value is not None:
            return name, value
    return None


_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ms": 1e-3, "s": 1.0,
             "m": 60.0, "h": 3600.0}
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")


def go_duration_s(raw: str) -> float:
    """Seconds in a Go duration (``time.ParseDuration``: ``300ms``, ``1.5s``, ``2h45m``;
    a bare ``0`` is zero); ValueError on anything else, negative durations included."""
    text = raw.strip()
    if text == "0":
        return 0.0
    pos, total = 0, 0.0
    while pos < len(text):
        part = _GO_PART.match(text, pos)
        if part is None:
            raise ValueError(raw)
        total += float(part.group(1)) * _GO_UNITS[part.group(2)]
        pos = part.end()
    if not text or not math.isfinite(total):
        raise ValueError(raw)
    return total


def queue_ttl_s(headers: Mapping[str, str]) -> float | None:
    """The request's queue TTL in seconds from :data:`INFERENCE_TTL`, or None (no header,
    or ``0s``: no TTL of its own, as in llm-d). A malformed value is a 400 naming the
    header, as for the SLO headers."""
    raw = headers.get(INFERENCE_TTL)
    if raw is None:
        return None
    try:
        ttl = go_duration_s(raw)
    except ValueError:
        raise bad_request(INFERENCE_TTL, "must be a Go duration such as 1500ms or 2s, got "
                          f"{raw[:40]!r}") from None
    return ttl if ttl > 0 else None
