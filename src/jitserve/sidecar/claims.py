"""A request held to its tenant's contract (issue 27: fair by contract).

After the SLO is resolved (:mod:`~jitserve.sidecar.api`), the tenant's entry in
``fairness.tenants[]`` (:mod:`jitserve.policy.contract`) decides what it may claim: a class
outside its ``classes`` is refused (403 naming the field or header it came in); a target
tighter than its ``tightest`` is clamped to the bound or refused, as
``fairness.beyondContract`` says. The tenant is the API key's when keys are on
(:func:`~jitserve.sidecar.intake.tenant_of`): a header cannot claim another tenant's
contract.
"""

from __future__ import annotations

from dataclasses import replace

from jitserve.policy import FairnessSettings
from jitserve.sidecar.api import ParsedRequest
from jitserve.sidecar.errors import APIError

CLASS_FIELD = "slo.class"


def hold_to_contract(parsed: ParsedRequest, tenant: str,
                     fairness: FairnessSettings) -> tuple[ParsedRequest, list[str]]:
    """(``parsed`` as ``tenant``'s contract allows it, the fields it claimed beyond it
    and that were clamped); raises APIError(403) for a claim the contract refuses, its
    ``param`` the field."""
    contract = fairness.tenant(tenant)
    if contract is None:
        return parsed, []
    asked = parsed.asked_class
    if asked is not None and contract.classes is not None and asked[0] not in contract.classes:
        name, param = asked
        allowed = ", ".join(contract.classes) or "none"
        raise APIError(403, f"{param}: tenant {tenant!r} may not use SLO class "
                       f"{name[:63]!r} (its classes: {allowed})", type_="permission_error",
                       param=param, code="class_not_in_contract")
    stages = (parsed.program.stages or 1) if parsed.program is not None else 1
    held, beyond = fairness.hold(tenant, parsed.slo, stages)
    if held is None:
        raise APIError(403, f"{beyond[0]}: tighter than tenant {tenant!r} may claim "
                       "(fairness.tenants[].tightest)", type_="permission_error",
                       param=beyond[0], code="slo_beyond_contract")
    return (replace(parsed, slo=held), beyond) if beyond else (parsed, [])
