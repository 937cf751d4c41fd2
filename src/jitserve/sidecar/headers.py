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

from collections.abc import Mapping

FAIRNESS_ID = "x-llm-d-inference-fairness-id"
OBJECTIVE = "x-llm-d-inference-objective"
SLO_TTFT = "x-llm-d-slo-ttft-ms"
SLO_TPOT = "x-llm-d-slo-tpot-ms"
SLO_DEADLINE = "x-llm-d-slo-deadline-ms"
SLO_CLASS = "x-llm-d-slo-class"
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
