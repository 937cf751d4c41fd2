"""The ``SLOPolicy`` settings model: one source of truth.

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
explain`` text is generated from them. The pod-level knobs (env from Secrets,
scheduling, volumes, model cache) are in :mod:`jitserve.policy_pod`.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from jitserve.policy_pod import EnvVar, ModelCache, PodSettings, Quantity, VolumeMount, pod_problems
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

    name: DNSLabel = Field(description="Class name requests ask for (slo.class, x-slo-class).")
    kind: SLOKind = Field(description="latency, deadline, compound or best_effort.")
    ttft_seconds: Seconds | None = Field(default=None, description="TTFT target (latency).")
    tbt_seconds: Seconds | None = Field(default=None, description="TBT target (latency).")
    deadline_seconds: Seconds | None = Field(
        default=None, description="End-to-end deadline (deadline), whole program (compound)."
    )

    @model_validator(mode="after")
    def _fields_match_kind(self) -> SLOClass:
        if self.kind is SLOKind.LATENCY and (self.ttft_seconds is None or self.tbt_seconds is None):
            raise ValueError(f"class {self.name}: kind latency needs ttftSeconds and tbtSeconds")
        if self.kind in (SLOKind.DEADLINE, SLOKind.COMPOUND) and self.deadline_seconds is None:
            raise ValueError(f"class {self.name}: kind {self.kind.value} needs deadlineSeconds")
        return self


class SLODefaults(_Model):
    """SLOs of requests that carry none, and named SLO classes."""

    latency: LatencyDefaults = Field(
        default=LatencyDefaults(), description="Defaults of latency requests (TTFT, TBT)."
    )
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
    classes: list[SLOClass] = Field(
        default_factory=list, max_length=64, description="Named SLO classes requests can ask for."
    )
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

    mode: CutoffMode = Field(
        default=CutoffMode.AUTO,
        description="fixed: p = value; auto: p adapts online among candidates toward the "
        "value that maximises measured goodput.",
    )
    value: float = Field(
        default=0.95, gt=0, le=1, description="p when mode is fixed; the starting point when auto."
    )
    candidates: list[Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=lambda: [0.5, 0.7, 0.8, 0.9, 0.95, 1.0],
        min_length=1,
        max_length=16,
        description="Values of p auto mode explores.",
    )
    epoch_frames: int = Field(
        default=20, ge=1, le=10000, description="Frames per exploration epoch in auto mode."
    )


class PreemptionSettings(_Model):
    """Preemption at frame boundaries (abort in vLLM, resume later as a continuation)."""

    enabled: bool = Field(default=True, description="Allow preempting running requests.")
    max_per_frame: int = Field(
        default=8, ge=0, le=1024, description="At most this many preemptions per frame."
    )
    cost_factor: float = Field(
        default=1.0,
        ge=0,
        le=100,
        description="Multiplier on the modelled cost (stall time x token rate).",
    )


class MechanismSettings(_Model):
    """Switches for each GMAX mechanism, all on by default: turning one off is an ablation
    (docs/scheduling.md measures each one's effect and the regime where it matters)."""

    cutoff: bool = Field(
        default=True,
        description=(
            "Keep only candidates with priority >= p x the B-th best before grouping; off ="
            " every one of the top k x B candidates may join the group (as p = 0)."
        ),
    )
    length_window: bool = Field(
        default=True,
        description=(
            "Group candidates of similar input length (sliding window of size B over"
            " candidates sorted by input length); off = the B best candidates by priority."
        ),
    )
    preemption: bool = Field(
        default=True,
        description=(
            "Swap out running requests outside the group when the gain beats the recompute"
            " cost; off (or preemption.enabled false) = never preempt."
        ),
    )
    refinement: bool = Field(
        default=True,
        description=(
            "Refine each request's length bound every refineEvery generated tokens; off ="
            " keep the bound given at arrival until the request outgrows it."
        ),
    )
    fairness: bool = Field(
        default=True,
        description=(
            "Blend each tenant's deficit against its weighted share into priority with"
            " weight f (fairness.weight); off = f is ignored."
        ),
    )
    aging: bool = Field(
        default=True,
        description="Raise priority by delta per frame waited (anti-starvation); off = no aging.",
    )
    overload_control: bool = Field(
        default=True,
        description=(
            "Retire (or demote, admission.overloadAction) requests that waited past"
            " admission.maxWaitingSeconds and are not planned soon, or whose deadline is out"
            " of reach even at full speed; off = keep everything. Baselines get the same layer"
            " under their -ac names."
        ),
    )
    prefill_pacing: bool = Field(
        default=True,
        description=(
            "Start new prompts no faster than the running requests' SLOs allow (keep the"
            " step time under their per-token need); off = start whatever fits the engine's"
            " token budget."
        ),
    )
    latest_start_sequencing: bool = Field(
        default=True,
        description=(
            "Start group members in latest-start order and drop from the group those that"
            " would start too late to meet their SLO; off = start group members by priority."
        ),
    )


class SchedulerSettings(_Model):
    """The GMAX scheduler's knobs."""

    policy: str = Field(
        default="gmax", pattern=r"^[a-z][a-z0-9-]*$", description="gmax or a baseline name."
    )
    cutoff: CutoffSettings = Field(
        default=CutoffSettings(), description="GMAX's priority cutoff p (fixed or auto)."
    )
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
    length_quantile: float = Field(
        default=0.95, gt=0, lt=1, description="Quantile q of the output-length upper bound."
    )
    refine_every: int = Field(
        default=50, ge=1, le=100000, description="Refine the length bound every N generated tokens."
    )
    candidate_factor: int = Field(
        default=4, ge=1, le=64, description="GMAX considers the top k x B requests."
    )
    soft_penalty: float = Field(
        default=1.0, ge=0, le=16, description="Exponent of the lateness discount."
    )
    preemption: PreemptionSettings = Field(
        default=PreemptionSettings(), description="When running requests may be preempted."
    )
    mechanisms: MechanismSettings = Field(
        default=MechanismSettings(),
        description="Each GMAX mechanism on or off (ablations); all on by default.",
    )


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
    """Admission and overload control."""

    max_waiting_seconds: Seconds = Field(
        default=5.0, description="Requests not scheduled within this are retired (paper section 5)."
    )
    queue_cap: int = Field(
        default=4096, ge=1, le=1_000_000, description="Requests beyond this queue get HTTP 429."
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


class PullPolicy(StrEnum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


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
    cpu: Quantity = Field(default="4", description="CPU of the vLLM container (request = limit).")
    memory: Quantity = Field(
        default="32Gi", description="Memory of the vLLM container (request = limit)."
    )
    gpu_resource: str = Field(
        default="nvidia.com/gpu",
        min_length=1,
        max_length=253,
        pattern=r"^([a-z0-9.-]+/)?[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$",
        description="Extended resource name of the accelerator.",
    )
    image_pull_policy: PullPolicy = Field(
        default=PullPolicy.IF_NOT_PRESENT, description="Always, IfNotPresent or Never."
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=128,
        description="Environment of the vLLM container: values or valueFrom references.",
    )
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list, max_length=64, description="Mounts of pod.volumes in vLLM."
    )
    cache: ModelCache | None = Field(
        default=None,
        description="A persistent model cache (PVC at /cache, HF_HOME); absent = emptyDir.",
    )
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
    cpu: Quantity = Field(default="1", description="CPU of the sidecar (request = limit).")
    memory: Quantity = Field(default="1Gi", description="Memory of the sidecar (request = limit).")


class IngressSpec(_Model):
    """An Ingress in front of the policy's Service."""

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
    path: str = Field(
        default="/", min_length=1, max_length=1024, pattern=r"^/", description="Path prefix."
    )
    annotations: dict[str, str] = Field(
        default_factory=dict, description="Annotations of the Ingress (controller settings)."
    )


class ReportingSettings(_Model):
    """How the operator reports SLO attainment in the status."""

    attainment_window_seconds: int = Field(
        default=300,
        ge=10,
        le=86400,
        description="Window of status.recentAttainment (the printer column): requests "
        "finished in the last N seconds, so the effect of tuning p or f shows within N s.",
    )


class SLOPolicySpec(_Model):
    """``spec`` of the ``SLOPolicy`` custom resource and the sidecar's config file."""

    objective: Objective = Field(
        default=Objective.TOKENS,
        description="What goodput counts: tokens (that met their SLO) or requests.",
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
    replicas: int = Field(default=1, ge=0, le=1000, description="Serving pods (scale subresource).")
    ingress: IngressSpec | None = Field(
        default=None, description="An Ingress to the Service; absent = none."
    )
    reporting: ReportingSettings = Field(
        default=ReportingSettings(), description="How attainment is reported in the status."
    )

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
        problems += pod_problems(
            self.model.env, self.model.volume_mounts, self.pod, self.model.cache
        )
        return problems


class ConditionType(StrEnum):
    READY = "Ready"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"


class Condition(_Model):
    """A Kubernetes-style status condition."""

    type: ConditionType = Field(description="Ready, Progressing or Degraded.")
    status: str = Field(pattern=r"^(True|False|Unknown)$", description="True, False or Unknown.")
    reason: str = Field(
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        max_length=1024,
        description="Why, in one CamelCase word (e.g. InvalidSpec, RollingOut).",
    )
    message: str = Field(default="", max_length=32768, description="Details for humans.")
    last_transition_time: str = Field(
        json_schema_extra={"format": "date-time"},
        description="When status last changed (RFC 3339).",
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation this condition was computed for."
    )


Fraction = Annotated[float, Field(ge=0, le=1)]


class Attainment(_Model):
    """SLO attainment (met / (met + missed + retired)) per request kind, from the sidecars."""

    latency: Fraction | None = Field(default=None, description="Latency (TTFT/TBT) requests.")
    deadline: Fraction | None = Field(default=None, description="Deadline requests.")
    compound: Fraction | None = Field(default=None, description="Compound program requests.")
    best_effort: Fraction | None = Field(default=None, description="Requests without an SLO.")
    overall: Fraction | None = Field(default=None, description="All requests together.")


class SLOPolicyStatus(_Model):
    """``status`` of the ``SLOPolicy`` custom resource, written by the operator."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation the operator last acted on."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
        description="Ready, Progressing and Degraded, one of each.",
    )
    replicas: int = Field(default=0, ge=0, description="Desired serving pods.")
    ready_replicas: int = Field(default=0, ge=0, description="Serving pods that are ready.")
    selector: str | None = Field(
        default=None, description="Label selector of the serving pods (scale subresource)."
    )
    effective_cutoff: float | None = Field(
        default=None, ge=0, le=1, description="Mean p the sidecars use now."
    )
    attainment: Attainment | None = Field(
        default=None,
        description="Lifetime SLO attainment: every request since the serving pods started.",
    )
    recent_attainment: Attainment | None = Field(
        default=None,
        description="SLO attainment over the last spec.reporting.attainmentWindowSeconds "
        "(the Attainment column): shows the effect of tuning p or f within that window.",
    )
    recent_window_seconds: float | None = Field(
        default=None,
        ge=0,
        description="Seconds of history behind recentAttainment: the window, or less while "
        "the operator has watched the pods for less than that.",
    )
    recent_requests: int | None = Field(
        default=None, ge=0, description="Requests counted in recentAttainment."
    )
    goodput_tokens_per_second: float | None = Field(
        default=None, ge=0, description="Goodput tokens/s between the last two scrapes."
    )
    scraped_pods: int = Field(
        default=0, ge=0, description="Sidecar metrics endpoints read in the last scrape."
    )
    last_scrape_time: str | None = Field(
        default=None,
        json_schema_extra={"format": "date-time"},
        description="When the sidecars were last read (RFC 3339).",
    )


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
