"""What the endpoint picker knows of a request before it picks: an :class:`Ask` (owner:
gateway).

As in ``jitserve gateway``: the SLO is read by the sidecar's own parser
(:func:`jitserve.sidecar.api.parse_request`: the body's ``slo`` object, the llm-d and
jitserve headers, the policy's classes and defaults) and the Ask is the gateway's
(:func:`jitserve.gateway.routing.ask_of`: prompt tokens counted or estimated, the output
bound ``max_tokens`` or the default), so a request is placed with the SLO it will be
scheduled with, whichever front door it came through. The tenant is the one the request
claims, or a digest of its API key (:data:`~jitserve.gateway.routing.KEYED`): the sidecar
checks keys; placement only needs to tell tenants apart.

A body the picker cannot read (not JSON, an SLO its copy of the policy refuses) is placed
as best effort and forwarded, so that the sidecar, the one owner of request validation,
answers it; likewise a request that is not a completion (``GET /v1/models``). A
completion whose body the picker does not see (headers only) asks with the SLO its
headers give.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from jitserve.gateway.routing import (
    CHARS_PER_TOKEN,
    DEFAULT_OUTPUT_BOUND,
    ask_of,
    placement_tenant,
)
from jitserve.placement.base import Ask, program_key
from jitserve.policy import SLOPolicySpec
from jitserve.sidecar.api import Endpoint, parse_request, resolve_slo
from jitserve.sidecar.claims import hold_to_contract
from jitserve.sidecar.errors import APIError
from jitserve.sidecar.intake import check_depth
from jitserve.slo import DeadlineSLO


def endpoint_of(path: str) -> Endpoint | None:
    """The OpenAI endpoint a ``:path`` names, or None for anything else."""
    route = path.split("?", 1)[0].rstrip("/")
    if route.endswith("/chat/completions"):
        return "chat"
    if route.endswith("/completions"):
        return "completions"
    return None


@dataclass(slots=True)
class AskBuilder:
    """Builds each request's :class:`Ask` from its headers and body."""

    spec: SLOPolicySpec = field(default_factory=SLOPolicySpec)
    max_body_bytes: int = 1 << 20
    """The most body the picker holds for one request (413 beyond)."""
    max_json_depth: int = 32
    clock: Callable[[], float] = time.time
    """Wall-clock seconds, the clock the placers' ``now_s`` and the reports' ``at_s`` use."""

    def _best_effort(self, request_id: str, tenant: str, now: float, size: int) -> Ask:
        slo = DeadlineSLO(self.spec.slo_defaults.best_effort_deadline_seconds,
                          best_effort=True)
        return Ask(request_id, tenant, slo, prompt_tokens=max(1, size // CHARS_PER_TOKEN),
                   output_bound=1, typical_output=1, arrival_s=now)

    def ask(self, headers: Mapping[str, str], body: bytes | None) -> Ask:
        """``headers``: lower-cased names, Envoy's pseudo-headers (``:path``) included;
        ``body``: None when the picker does not see one (a headers-only request, or a
        processing mode that does not send bodies)."""
        now = float(self.clock())
        request_id = headers.get("x-request-id") or f"pick-{uuid.uuid4().hex}"
        tenant = placement_tenant(headers)
        endpoint = endpoint_of(headers.get(":path", ""))
        if endpoint is None:
            return self._best_effort(request_id, tenant, now, len(body or b""))
        tenant_class = self.spec.fairness.default_class_of(tenant)
        try:
            if body is None:
                slo, _, ref = resolve_slo(None, headers, self.spec.slo_defaults, tenant_class,
                                          self.spec.limits)
                program = program_key(tenant, ref.program_id) if ref is not None else None
                return Ask(request_id, tenant, slo, prompt_tokens=1,
                           output_bound=DEFAULT_OUTPUT_BOUND,
                           typical_output=DEFAULT_OUTPUT_BOUND // 2, arrival_s=now,
                           program=program)
            doc = json.loads(body)
            if isinstance(doc, dict | list):
                check_depth(doc, self.max_json_depth)
            parsed = parse_request(endpoint, doc, headers, self.spec.slo_defaults,
                                   tenant_class, self.spec.limits)
            parsed, _ = hold_to_contract(parsed, tenant, self.spec.fairness)  # as the sidecar
        except (APIError, ValueError, UnicodeDecodeError, RecursionError):
            return self._best_effort(request_id, tenant, now, len(body or b""))
        return ask_of(parsed, tenant, request_id, now)
