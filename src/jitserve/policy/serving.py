"""The serving sections of the ``SLOPolicy`` model the operator reads: the model and its
vLLM container, the sidecar container, the Ingress, and how status reports attainment
(:mod:`jitserve.policy` assembles the sections)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import ConfigDict, Field

from jitserve.policy.base import SpecModel as _Model
from jitserve.policy.batch import (
    GPU_MAX_NUM_SEQS,
    ArgsError,
    BatchShape,
    batch_shape,
    parallel_args,
)
from jitserve.policy.pod import EnvVar, ModelCache, Quantity, VolumeMount

# The vLLM release the tests run (scripts/setup-vllm.sh builds its CPU variant).
VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"


class PullPolicy(StrEnum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


class ModelSpec(_Model):
    """The model to serve and the vLLM container serving it (changing any of it rolls pods)."""

    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="The served model name: what clients send as `model` (vLLM's "
        "--served-model-name). Required for serving pods.",
    )
    source: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="What vLLM loads (--model): a Hugging Face id, or a path in a mounted "
        "volume (e.g. /models/llama from pod.volumes); default: name.",
    )
    image: str = Field(default=VLLM_IMAGE, min_length=1, max_length=512, description="vLLM image.")
    args: list[str] = Field(
        default_factory=list,
        max_length=128,
        description="Extra vLLM server arguments. A --max-num-seqs here is B for the sidecar "
        f"too (default {GPU_MAX_NUM_SEQS}); --tensor-parallel-size follows gpus (set it only "
        "with --pipeline-parallel-size, their product equal to gpus).",
    )
    gpus: int = Field(
        default=1,
        ge=0,
        le=16,
        description="GPUs per replica (limits of gpuResource); vLLM's tensor parallel size.",
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

    @property
    def served_name(self) -> str:
        if self.name is None:
            raise ValueError("model.name is required for a serving pod")
        return self.name

    @property
    def loaded(self) -> str:
        return self.source or self.served_name

    def batch_shape(
        self, engine_queue: int | None = None, default_max_num_seqs: int = GPU_MAX_NUM_SEQS
    ) -> BatchShape:
        """B (vLLM's --max-num-seqs, the sidecar's --max-running) and the engine queue."""
        return batch_shape(
            self.args, default_max_num_seqs=default_max_num_seqs, engine_queue=engine_queue
        )

    def vllm_args(self) -> list[str]:
        """``args`` plus the parallelism and batch flags derived from the spec."""
        return [*parallel_args(self.args, self.gpus), *self.batch_shape().vllm_args(self.args)]

    def args_problems(self) -> list[str]:
        """vLLM arguments the pod's shape is derived from, when they are malformed or
        contradict gpus (a command line: no CEL rule can parse it)."""
        try:
            self.vllm_args()
        except ArgsError as err:
            return [f"model.args: {err}"]
        return []


class SidecarSpec(_Model):
    """The scheduler sidecar container in front of vLLM."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "self.adminPort != self.port",
                    "message": "sidecar.adminPort: must differ from sidecar.port",
                }
            ]
        }
    )

    port: int = Field(
        default=8080,
        ge=1024,
        le=65535,
        description="Sidecar HTTP port: the API, the one the Service and Ingress route.",
    )
    admin_port: int = Field(
        default=9090,
        ge=1024,
        le=65535,
        description="Sidecar admin port: /metrics and /debug/scheduler, no key needed; never "
        "routed by the Service or Ingress (the NetworkPolicy admits only the monitoring and "
        "operator namespaces). The operator's status scrape and the PodMonitor read it.",
    )
    engine_queue: int | None = Field(
        default=None,
        ge=0,
        le=4096,
        description="Requests the sidecar keeps queued inside vLLM beyond its B slots "
        "(default: B/2, at least 2).",
    )
    cpu: Quantity = Field(default="1", description="CPU of the sidecar (request = limit).")
    memory: Quantity = Field(default="1Gi", description="Memory of the sidecar (request = limit).")


class IngressSpec(_Model):
    """An Ingress in front of the policy's Service."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.tlsSecret) || has(self.host)",
                    "message": "ingress.tlsSecret: TLS needs ingress.host",
                }
            ]
        }
    )

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
