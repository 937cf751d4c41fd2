"""The serving sections of the ``SLOPolicy`` model the operator reads: the model and its
vLLM container, the sidecar container, the Ingress, and how status reports attainment
(:mod:`jitserve.policy` assembles the sections)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from jitserve.policy_base import SpecModel as _Model
from jitserve.policy_pod import EnvVar, ModelCache, Quantity, VolumeMount


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
