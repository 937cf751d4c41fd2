"""The ``SLOPolicy`` settings model: one source of truth.

The same pydantic model validates the ``SLOPolicy`` custom resource (its OpenAPI schema
in ``crds/`` is generated from it), the sidecar's config file (the ConfigMap the
operator mounts) and the simulator's settings. Field names are snake_case in Python and
camelCase on the wire (YAML, JSON, the CRD), as Kubernetes API conventions ask.

Sections: ``sloDefaults`` (per-kind defaults and named classes), ``objective``,
``scheduler`` (cutoff ``p``, frame, aging ``delta``, length quantile, refinement,
preemption), ``fairness`` (weight ``f``, tenant weights), ``admission`` (waiting time,
queue cap, overload action), and the serving sections the operator reads
(``model``, ``replicas``, ``ingress``).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from jitserve.slo import SLO, CompoundSLO, DeadlineSLO, LatencySLO, SLOKind

Seconds = Annotated[float, Field(gt=0, le=86400)]
DNSLabel = Annotated[
    str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class LatencyDefaults(_Model):
    ttft_seconds: Seconds = Field(
        default=2.0, description="Time to first token target (paper: P95 of real API calls)."
    )
    tbt_seconds: Seconds = Field(default=0.1, description="Time between tokens target.")


class SLOClass(_Model):
    """A named SLO class tenants can ask for (e.g. ``interactive``, ``batch``)."""

    name: DNSLabel
    kind: SLOKind
    ttft_seconds: Seconds | None = None
    tbt_seconds: Seconds | None = None
    deadline_seconds: Seconds | None = None

    @model_validator(mode="after")
    def _fields_match_kind(self) -> SLOClass:
        if self.kind is SLOKind.LATENCY and (self.ttft_seconds is None or self.tbt_seconds is None):
            raise ValueError(f"class {self.name}: kind latency needs ttftSeconds and tbtSeconds")
        if self.kind in (SLOKind.DEADLINE, SLOKind.COMPOUND) and self.deadline_seconds is None:
            raise ValueError(f"class {self.name}: kind {self.kind.value} needs deadlineSeconds")
        return self


class SLODefaults(_Model):
    latency: LatencyDefaults = LatencyDefaults()
    deadline_seconds: Seconds = Field(
        default=20.0, description="End-to-end latency target of deadline requests."
    )
    compound_seconds_per_stage: Seconds = Field(
        default=20.0, description="Compound deadline = this x number of stages."
    )
    best_effort_deadline_seconds: Seconds = Field(
        default=120.0,
        description="Deadline given to requests without an SLO, so they never starve.",
    )
    classes: list[SLOClass] = Field(default_factory=list, max_length=64)
    default_class: DNSLabel | None = Field(
        default=None,
        description=(
            "SLO class of requests that carry no SLO fields (a tenant's own defaultClass wins);"
            " none: best effort with bestEffortDeadlineSeconds."
        ),
    )

    def unspecified_class(self, tenant_default: str | None) -> str | None:
        """The class of a request without SLO fields: the tenant's, else the policy's."""
        return tenant_default or self.default_class

    def slo_for(self, kind: SLOKind, stages: int = 1) -> SLO:
        """The default SLO of ``kind``."""
        if kind is SLOKind.LATENCY:
            return LatencySLO(self.latency.ttft_seconds, self.latency.tbt_seconds)
        if kind is SLOKind.DEADLINE:
            return DeadlineSLO(self.deadline_seconds)
        if kind is SLOKind.COMPOUND:
            return CompoundSLO(self.compound_seconds_per_stage * stages)
        return DeadlineSLO(self.best_effort_deadline_seconds, best_effort=True)

    def class_slo(self, name: str) -> SLO | None:
        for cls in self.classes:
            if cls.name == name:
                if cls.kind is SLOKind.LATENCY:
                    assert cls.ttft_seconds is not None and cls.tbt_seconds is not None
                    return LatencySLO(cls.ttft_seconds, cls.tbt_seconds)
                if cls.kind is SLOKind.BEST_EFFORT:
                    return self.slo_for(SLOKind.BEST_EFFORT)
                assert cls.deadline_seconds is not None
                if cls.kind is SLOKind.COMPOUND:
                    return CompoundSLO(cls.deadline_seconds)
                return DeadlineSLO(cls.deadline_seconds)
        return None


class Objective(StrEnum):
    TOKENS = "tokens"
    REQUESTS = "requests"


class CutoffMode(StrEnum):
    FIXED = "fixed"
    AUTO = "auto"


class CutoffSettings(_Model):
    """GMAX's priority cutoff ``p``: candidates keep priority >= p x the B-th best."""

    mode: CutoffMode = CutoffMode.AUTO
    value: float = Field(
        default=0.95, gt=0, le=1, description="p when mode is fixed; the starting point when auto."
    )
    candidates: list[Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=lambda: [0.5, 0.7, 0.8, 0.9, 0.95, 1.0], min_length=1, max_length=16
    )
    epoch_frames: int = Field(
        default=20, ge=1, le=10000, description="Frames per exploration epoch in auto mode."
    )


class PreemptionSettings(_Model):
    enabled: bool = True
    max_per_frame: int = Field(default=8, ge=0, le=1024)
    cost_factor: float = Field(
        default=1.0,
        ge=0,
        le=100,
        description="Multiplier on the modelled cost (stall time x token rate).",
    )


class SchedulerSettings(_Model):
    policy: str = Field(
        default="gmax", pattern=r"^[a-z][a-z0-9-]*$", description="gmax or a baseline name."
    )
    cutoff: CutoffSettings = CutoffSettings()
    frame_steps: int = Field(
        default=50, ge=1, le=10000, description="Decode steps per scheduling frame."
    )
    delta: float = Field(
        default=0.05,
        ge=0,
        le=1000,
        description=(
            "Anti-starvation aging: priority added per frame waited,"
            " as a fraction of the median priority."
        ),
    )
    length_quantile: float = Field(default=0.95, gt=0, lt=1)
    refine_every: int = Field(
        default=50, ge=1, le=100000, description="Refine the length bound every N generated tokens."
    )
    candidate_factor: int = Field(
        default=4, ge=1, le=64, description="GMAX considers the top k x B requests."
    )
    soft_penalty: float = Field(
        default=1.0, ge=0, le=16, description="Exponent of the lateness discount."
    )
    preemption: PreemptionSettings = PreemptionSettings()


class TenantSpec(_Model):
    name: DNSLabel
    weight: float = Field(default=1.0, gt=0, le=1000)
    api_key_secret: str | None = Field(
        default=None, description="Name of a Secret whose key 'api-key' identifies this tenant."
    )
    default_class: DNSLabel | None = Field(
        default=None,
        description="SLO class of this tenant's requests that carry no SLO fields.",
    )


class FairnessSettings(_Model):
    weight: float = Field(
        default=0.0, ge=0, le=1, description="f: 0 = pure goodput, 1 = pure fair share."
    )
    tenants: list[TenantSpec] = Field(default_factory=list, max_length=1000)
    window_seconds: Seconds = Field(
        default=60.0, description="Horizon of the service each tenant received."
    )

    def weight_of(self, tenant: str) -> float:
        for spec in self.tenants:
            if spec.name == tenant:
                return spec.weight
        return 1.0

    def default_class_of(self, tenant: str) -> str | None:
        for spec in self.tenants:
            if spec.name == tenant:
                return spec.default_class
        return None


class OverloadAction(StrEnum):
    DROP = "drop"
    DEMOTE = "demote"


class AdmissionSettings(_Model):
    max_waiting_seconds: Seconds = Field(
        default=5.0, description="Requests not scheduled within this are retired (paper section 5)."
    )
    queue_cap: int = Field(default=4096, ge=1, le=1_000_000)
    overload_action: OverloadAction = OverloadAction.DROP


Quantity = Annotated[
    str,
    Field(
        min_length=1,
        max_length=64,
        pattern=r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|[numkMGTPE]i?|Ki)?$",
        description="A Kubernetes quantity, e.g. 500m, 4, 32Gi.",
    ),
]
EnvName = Annotated[
    str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
]


class PullPolicy(StrEnum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


class EnvVar(_Model):
    """A plain environment variable of the vLLM container."""

    name: EnvName
    value: str = ""


class ModelSpec(_Model):
    """The model to serve and the vLLM container serving it (changing any of it rolls pods)."""

    name: str = Field(
        default="tiny-llama",
        min_length=1,
        max_length=253,
        description="Model id or path given to vLLM (--model).",
    )
    image: str = Field(
        default="vllm/vllm-openai:v0.11.0", min_length=1, max_length=512, description="vLLM image."
    )
    args: list[str] = Field(
        default_factory=list, max_length=128, description="Extra vLLM server arguments."
    )
    gpus: int = Field(
        default=1, ge=0, le=16, description="GPUs per replica (limits of gpuResource)."
    )
    cpu: Quantity = "4"
    memory: Quantity = "32Gi"
    gpu_resource: str = Field(
        default="nvidia.com/gpu",
        min_length=1,
        max_length=253,
        pattern=r"^([a-z0-9.-]+/)?[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$",
        description="Extended resource name of the accelerator.",
    )
    image_pull_policy: PullPolicy = PullPolicy.IF_NOT_PRESENT
    env: list[EnvVar] = Field(default_factory=list, max_length=128)
    port: int = Field(default=8000, ge=1024, le=65535, description="vLLM's port inside the pod.")
    shm_size: Quantity = Field(default="2Gi", description="Size of the /dev/shm memory volume.")
    startup_seconds: int = Field(
        default=1800,
        ge=30,
        le=86400,
        description="How long vLLM may take to load the model before it is restarted.",
    )


class SidecarSpec(_Model):
    """The scheduler sidecar container in front of vLLM."""

    port: int = Field(
        default=8080, ge=1024, le=65535, description="Sidecar HTTP port (API and /metrics)."
    )
    cpu: Quantity = "1"
    memory: Quantity = "1Gi"


class IngressSpec(_Model):
    host: str | None = Field(
        default=None,
        max_length=253,
        pattern=r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        description="Host name the Ingress routes; empty = all hosts.",
    )
    class_name: str | None = Field(default=None, max_length=253, description="IngressClass name.")
    tls_secret: str | None = Field(
        default=None, max_length=253, description="Secret holding the TLS certificate (needs host)."
    )
    path: str = Field(default="/", min_length=1, max_length=1024, pattern=r"^/")
    annotations: dict[str, str] = Field(default_factory=dict)


class SLOPolicySpec(_Model):
    """``spec`` of the ``SLOPolicy`` custom resource and the sidecar's config file."""

    objective: Objective = Objective.TOKENS
    slo_defaults: SLODefaults = SLODefaults()
    scheduler: SchedulerSettings = SchedulerSettings()
    fairness: FairnessSettings = FairnessSettings()
    admission: AdmissionSettings = AdmissionSettings()
    model: ModelSpec = ModelSpec()
    sidecar: SidecarSpec = SidecarSpec()
    replicas: int = Field(default=1, ge=0, le=1000)
    ingress: IngressSpec | None = None

    def cross_field_problems(self) -> list[str]:
        """Rules the CRD's OpenAPI schema cannot express, each naming its field (wire path)."""
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
        for path, wanted in defaults:
            if wanted is not None and wanted not in classes:
                problems.append(f"{path}: {wanted!r} is not in sloDefaults.classes")
        if self.sidecar.port == self.model.port:
            problems.append(
                f"sidecar.port: {self.sidecar.port} is also model.port (one pod, one port each)"
            )
        if self.ingress is not None and self.ingress.tls_secret and not self.ingress.host:
            problems.append("ingress.tlsSecret: TLS needs ingress.host")
        return problems


class ConditionType(StrEnum):
    READY = "Ready"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"


class Condition(_Model):
    """A Kubernetes-style status condition."""

    type: ConditionType
    status: str = Field(pattern=r"^(True|False|Unknown)$")
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024)
    message: str = Field(default="", max_length=32768)
    last_transition_time: str
    observed_generation: int | None = Field(default=None, ge=0)


Fraction = Annotated[float, Field(ge=0, le=1)]


class Attainment(_Model):
    """SLO attainment (met / (met + missed + retired)) per request kind, from the sidecars."""

    latency: Fraction | None = None
    deadline: Fraction | None = None
    compound: Fraction | None = None
    best_effort: Fraction | None = None
    overall: Fraction | None = None


class SLOPolicyStatus(_Model):
    """``status`` of the ``SLOPolicy`` custom resource, written by the operator."""

    observed_generation: int | None = Field(default=None, ge=0)
    conditions: list[Condition] = Field(default_factory=list)
    replicas: int = Field(default=0, ge=0)
    ready_replicas: int = Field(default=0, ge=0)
    selector: str | None = Field(
        default=None, description="Label selector of the serving pods (scale subresource)."
    )
    effective_cutoff: float | None = Field(
        default=None, ge=0, le=1, description="Mean p the sidecars use now."
    )
    attainment: Attainment | None = None
    goodput_tokens_per_second: float | None = Field(default=None, ge=0)
    scraped_pods: int = Field(
        default=0, ge=0, description="Sidecar metrics endpoints read in the last scrape."
    )
    last_scrape_time: str | None = None


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
        document = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise PolicyError(f"cannot read policy file {path}: {err}") from err
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise PolicyError(f"policy file {path}: top level must be a mapping")
    return load_policy(document)
