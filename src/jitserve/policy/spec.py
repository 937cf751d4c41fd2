"""The ``SLOPolicy`` settings model (``SLOPolicySpec``), its loaders: one source of truth.

The same pydantic model validates the ``SLOPolicy`` custom resource (its OpenAPI schema
in ``crds/`` is generated from it), the sidecar's config file (the ConfigMap the
operator mounts) and the simulator's settings. Field names are snake_case in Python and
camelCase on the wire (YAML, JSON, the CRD), as Kubernetes API conventions ask.

Sections: ``sloDefaults`` (per-kind defaults and named classes), ``objective``,
``scheduler`` (cutoff ``p``, frame, aging ``delta``, length quantile, refinement,
preemption, ``mechanisms``: each GMAX mechanism on or off), ``fairness`` (weight ``f``,
tenant weights), ``admission`` (waiting time, queue cap, overload action), ``limits``
(what one client may ask for: SLO values, program stages and lifetime, live programs),
and the serving sections the operator reads (``model``, ``pod``, ``replicas``,
``ingress``, ``reporting``). Every field carries a description: the CRD's ``kubectl
explain`` text is generated from them. This module holds the top-level sections
(fairness, admission, limits) and assembles the rest from their modules: the pod-level
knobs (env from Secrets, scheduling, volumes, model cache) are in
:mod:`jitserve.policy.pod`, the SLO defaults and classes in :mod:`jitserve.policy.slo`.
Importers outside the package use its face, :mod:`jitserve.policy`.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError

from jitserve.policy.autoscaling import AutoscalingSettings
from jitserve.policy.base import DNSLabel, Seconds, cel
from jitserve.policy.base import SpecModel as _Model
from jitserve.policy.contract import BeyondContract, ClaimBounds
from jitserve.policy.pod import PodSettings, pod_problems, pod_webhook_problems
from jitserve.policy.scheduler import Objective, SchedulerSettings
from jitserve.policy.serving import IngressSpec, ModelSpec, ReportingSettings, SidecarSpec
from jitserve.policy.slo import SLODefaults
from jitserve.slo import SLO


class TenantSpec(_Model):
    """A tenant and its weighted fair share."""

    name: DNSLabel = Field(description="Tenant name (label of its metrics).")
    weight: float = Field(default=1.0, gt=0, le=1000, description="Relative share of service.")
    api_key_secret: str | None = Field(
        default=None, description="Name of a Secret whose key 'api-key' identifies this tenant."
    )
    default_class: DNSLabel | None = Field(
        default=None,
        description="SLO class of this tenant's requests that carry no SLO fields.",
    )
    classes: list[DNSLabel] | None = Field(
        default=None, max_length=100,
        description="The SLO classes this tenant may ask for (absent: any class).",
    )
    tightest: ClaimBounds | None = Field(
        default=None,
        description="The tightest targets this tenant may claim (absent: no bound); a claim "
        "beyond them is clamped or refused (fairness.beyondContract).",
    )


class FairnessSettings(_Model):
    """Weighted fairness between tenants, blended into GMAX's priority with weight f."""

    weight: float = Field(
        default=0.0, ge=0, le=1, description="f: 0 = pure goodput, 1 = pure fair share."
    )
    tenants: list[TenantSpec] = Field(
        default_factory=list,
        max_length=1000,
        description="Tenants with their weights; unknown tenants weigh 1.",
    )
    window_seconds: Seconds = Field(
        default=60.0, description="Horizon of the service each tenant received."
    )
    beyond_contract: BeyondContract = Field(
        default=BeyondContract.CLAMP,
        description="A claim past a tenant's tightest bounds: clamp (served at the bound) "
        "or refuse (403 naming the field); either is counted per tenant.",
    )

    def tenant(self, name: str) -> TenantSpec | None:
        """The tenant's entry (None: an unlisted tenant: weight 1, no contract bounds)."""
        return next((spec for spec in self.tenants if spec.name == name), None)

    def weight_of(self, tenant: str) -> float:
        spec = self.tenant(tenant)
        return spec.weight if spec is not None else 1.0

    def default_class_of(self, tenant: str) -> str | None:
        spec = self.tenant(tenant)
        return spec.default_class if spec is not None else None

    def hold(self, tenant: str, slo: SLO, stages: int = 1) -> tuple[SLO | None, list[str]]:
        """(``slo`` as ``tenant``'s contract holds it — clamped to its ``tightest`` bounds,
        or None when ``beyondContract: refuse`` refuses it —, the fields it claimed beyond
        them). ``stages``: a compound program's, when known. The one rule the sidecar, the
        gateway and the simulator apply."""
        spec = self.tenant(tenant)
        bounds = spec.tightest if spec is not None else None
        beyond = bounds.beyond(slo, stages) if bounds is not None else []
        if bounds is None or not beyond:
            return slo, []
        if self.beyond_contract is BeyondContract.REFUSE:
            return None, beyond
        return bounds.clamp(slo, stages), beyond


class OverloadAction(StrEnum):
    DROP = "drop"
    DEMOTE = "demote"


class MaxWaitingRetires(StrEnum):
    ALL = "all"
    LATE = "late"


class AdmissionSettings(_Model):
    """Admission and overload control."""

    max_waiting_seconds: Seconds = Field(
        default=5.0,
        description="Requests not scheduled within this are retired (paper section 5), all "
        "or only the late ones (maxWaitingRetires).",
    )
    max_waiting_retires: MaxWaitingRetires = Field(
        default=MaxWaitingRetires.ALL,
        description="Which requests past maxWaitingSeconds are retired: all (the paper) or "
        "only those that, started now at the engine's current speed, would miss their SLO "
        "(late); a deadline request with slack left keeps waiting.",
    )
    queue_cap: int = Field(
        default=4096, ge=1, le=1_000_000, description="Requests beyond this queue get HTTP 429."
    )
    on_time_quantile: float = Field(
        default=0.9, ge=0.0, le=0.999,
        description="A latency request is refused at the door (HTTP 429, would_start_late) "
        "when its first token, forecast from the queue ahead of it plus this quantile of "
        "the forecast's observed error (actual minus forecast TTFT of recent requests), "
        "would come after its TTFT target: the attainment served requests aim at. 0: no "
        "door check.",
    )
    overload_action: OverloadAction = Field(
        default=OverloadAction.DROP,
        description="A request whose deadline is out of reach: drop it (HTTP 503, "
        "slo_unreachable) or demote it to best effort.",
    )


class LimitsSettings(_Model):
    """What a single request may ask for, so one tenant cannot hold a pod's memory or
    queue hostage: the sidecar refuses a request over a limit with 400 naming the field
    (body ``slo.*`` and ``x-slo-*`` headers alike) and 429 when the live programs are
    at ``maxPrograms``."""

    max_slo_seconds: Seconds = Field(
        default=3600.0,
        description="Largest TTFT, TBT or deadline a request may ask for (body or x-slo-* header).",
    )
    max_stages: int = Field(
        default=64, ge=1, le=10000, description="Largest `stages` of a compound program."
    )
    max_program_seconds: Seconds = Field(
        default=3600.0,
        description="Longest program lifetime: a compound deadline (given or derived) beyond "
        "it is refused, and a program's state is dropped at its deadline.",
    )
    max_programs: int = Field(
        default=10000,
        ge=1,
        le=1_000_000,
        description="Compound programs a sidecar keeps state for at once (429 beyond).",
    )


class SLOPolicySpec(_Model):
    """``spec`` of the ``SLOPolicy`` custom resource and the sidecar's config file."""

    model_config = cel(
        ("has(self.model.name)", "model.name: required (the served model name)"),
        (
            "self.sidecar.port != self.model.port && self.sidecar.adminPort != self.model.port",
            "sidecar.port, sidecar.adminPort: each must differ from model.port",
        ),
        (
            "self.fairness.tenants.all(t, !has(t.defaultClass) || "
            "self.sloDefaults.classes.exists(c, c.name == t.defaultClass))",
            "fairness.tenants[].defaultClass: not in sloDefaults.classes",
        ),
        (
            "self.fairness.tenants.all(t, !has(t.classes) || t.classes.all(n, "
            "self.sloDefaults.classes.exists(c, c.name == n)))",
            "fairness.tenants[].classes: not in sloDefaults.classes",
        ),
        (
            "self.fairness.tenants.all(t, !has(t.classes) || !has(t.defaultClass) || "
            "t.defaultClass in t.classes)",
            "fairness.tenants[].defaultClass: not in the tenant's classes",
        ),
        (
            "self.model.volumeMounts.all(m, m.name == 'cache' || "
            "self.pod.volumes.exists(v, v.name == m.name))",
            "model.volumeMounts[].name: no such volume in pod.volumes",
        ),
    )

    objective: Objective = Field(
        default=Objective.TOKENS,
        description="What goodput counts: tokens (that met their SLO) or requests (that "
        "met it whole; a latency request whose TTFT passed without a first token is then "
        "unreachable, see admission.overloadAction).",
    )
    slo_defaults: SLODefaults = Field(
        default=SLODefaults(), description="SLOs of requests that carry none; SLO classes."
    )
    scheduler: SchedulerSettings = Field(
        default=SchedulerSettings(), description="GMAX: cutoff p, frame, aging, preemption."
    )
    fairness: FairnessSettings = Field(
        default=FairnessSettings(), description="Fairness weight f and tenants' weights."
    )
    admission: AdmissionSettings = Field(
        default=AdmissionSettings(), description="Waiting limit, queue cap, overload action."
    )
    limits: LimitsSettings = Field(
        default=LimitsSettings(),
        description="What one request may ask for: SLO values, program stages, lifetime, count.",
    )
    model: ModelSpec = Field(default=ModelSpec(), description="The model and its vLLM container.")
    sidecar: SidecarSpec = Field(default=SidecarSpec(), description="The scheduler sidecar.")
    pod: PodSettings = Field(
        default=PodSettings(), description="Scheduling, pull Secrets, volumes of the pods."
    )
    replicas: int = Field(
        default=1, ge=0, le=1000,
        description="Serving pods (scale subresource; with autoscaling.enabled the operator "
        "sets it).",
    )
    autoscaling: AutoscalingSettings = Field(
        default=AutoscalingSettings(),
        description="The operator sizes the serving pods from SLO attainment (off by default).",
    )
    ingress: IngressSpec | None = Field(
        default=None, description="An Ingress to the Service; absent = none."
    )
    reporting: ReportingSettings = Field(
        default=ReportingSettings(), description="How attainment is reported in the status."
    )

    def with_scheduler(self, **changes: Any) -> SLOPolicySpec:
        """``self`` with these ``scheduler`` fields replaced (not validated again: pass
        values of the fields' own types)."""
        return self.model_copy(update={"scheduler": self.scheduler.model_copy(update=changes)})

    def cross_field_problems(self) -> list[str]:
        """Rules the CRD's OpenAPI schema cannot express, each naming its field (wire path):
        :meth:`cel_problems` and :meth:`webhook_problems`."""
        return [*self.cel_problems(), *self.webhook_problems()]

    def webhook_problems(self) -> list[str]:
        """The rules no CEL rule of the CRD states (a command line to parse, volume sources
        the schema leaves open): the webhook checks them on every API server."""
        return [*self.model.args_problems(), *pod_webhook_problems(self.pod)]

    def cel_problems(self) -> list[str]:
        """The rules the CRD's CEL ``x-kubernetes-validations`` state too (and duplicate
        names, which its list-maps refuse): the webhook checks them only where the API
        server has no CEL."""
        problems: list[str] = []
        for section, items in (
            ("sloDefaults.classes", [c.name for c in self.slo_defaults.classes]),
            ("fairness.tenants", [t.name for t in self.fairness.tenants]),
        ):
            seen: set[str] = set()
            for index, name in enumerate(items):
                if name in seen:
                    problems.append(f"{section}[{index}].name: duplicate name {name!r}")
                seen.add(name)
        classes = {c.name for c in self.slo_defaults.classes}
        defaults: list[tuple[str, str | None]] = [
            ("sloDefaults.defaultClass", self.slo_defaults.default_class),
            *((f"fairness.tenants[{i}].defaultClass", tenant.default_class)
              for i, tenant in enumerate(self.fairness.tenants)),
        ]
        for i, tenant in enumerate(self.fairness.tenants):
            allowed = tenant.classes
            if allowed is None:
                continue
            defaults += [(f"fairness.tenants[{i}].classes", name) for name in allowed]
            if tenant.default_class is not None and tenant.default_class not in allowed:
                problems.append(f"fairness.tenants[{i}].defaultClass: "
                                f"{tenant.default_class!r} is not in the tenant's classes")
        for path, wanted in defaults:
            if wanted is not None and wanted not in classes:
                problems.append(f"{path}: {wanted!r} is not in sloDefaults.classes")
        if self.model.name is None:
            problems.append("model.name: required (the served model name)")
        for field, port in (("port", self.sidecar.port), ("adminPort", self.sidecar.admin_port)):
            if port == self.model.port:
                problems.append(f"sidecar.{field}: {port} is also model.port (one port each)")
        if self.sidecar.admin_port == self.sidecar.port:
            problems.append(f"sidecar.adminPort: {self.sidecar.port} is also sidecar.port")
        if self.ingress is not None and self.ingress.tls_secret and not self.ingress.host:
            problems.append("ingress.tlsSecret: TLS needs ingress.host")
        problems += pod_problems(
            self.model.env, self.model.volume_mounts, self.pod, self.model.cache
        )
        return problems


class PolicyError(ValueError):
    """A policy document is invalid; the message names each bad field (camelCase path)."""


def load_policy(document: dict[str, Any]) -> SLOPolicySpec:
    """Validate a spec mapping (wire names) and return the model, or raise PolicyError."""
    try:
        return SLOPolicySpec.model_validate(document)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in err.errors()
        )
        raise PolicyError(problems) from err


def dump_policy_yaml(spec: SLOPolicySpec) -> str:
    """The sidecar config file body (wire names), as the operator writes it to a ConfigMap."""
    return yaml.safe_dump(
        spec.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=True
    )


def load_policy_file(path: str | Path) -> SLOPolicySpec:
    """Read and validate a YAML or JSON policy file; PolicyError names what is wrong."""
    try:
        document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise PolicyError(f"cannot read policy file {path}: {err}") from err
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise PolicyError(f"policy file {path}: top level must be a mapping")
    return load_policy(document)
