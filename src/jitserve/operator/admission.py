"""The validating admission webhook's decision: refuse specs the CRD schema cannot judge.

The CRD states its cross-field rules (a sidecar port equal to the model port, TLS without
a host, env ``value`` and ``valueFrom`` together, volume mounts of undeclared volumes, the
policy name's length, ...) as CEL ``x-kubernetes-validations``. Where the API server
evaluates them (Kubernetes >= 1.25: ``OperatorSettings.api_server_cel``) the webhook checks
only what CEL cannot say (:meth:`jitserve.policy.SLOPolicySpec.webhook_problems`: vLLM's
command line, volume sources the schema leaves open); an older API server (1.20 ignores
the field) gets every rule here, at ``kubectl apply`` time, with the same code the
reconciler uses (:func:`jitserve.operator.reconcile.spec_problems`), each problem naming
its field.

An UPDATE that leaves ``spec`` as it was is always allowed: kopf's own bookkeeping
(annotations) and label edits must go through even on a policy that was stored before
the webhook existed and is invalid (it stays ``Degraded`` until its spec is fixed).
"""

from __future__ import annotations

from typing import Any

from jitserve.operator.reconcile import spec_problems

WEBHOOK_ID = "validate-slopolicy"  # the handler id = the URL path kopf serves it under
WEBHOOK_NAME = "validate.slopolicies.jitserve.io"  # the name in the webhook configuration


def admission_problems(
    body: dict[str, Any], old: dict[str, Any] | None = None, *, cel: bool = False
) -> list[str]:
    """Why ``body`` must be refused (empty: allow); ``cel``: the API server checked the
    CRD's CEL rules already."""
    if old is not None and (old.get("spec") or {}) == (body.get("spec") or {}):
        return []
    _, problems = spec_problems(body, cel=cel)
    return problems
