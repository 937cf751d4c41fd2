"""Pod-level knobs of the ``SLOPolicy`` spec: what makes a serving pod real on a cluster.

Part of the ``SLOPolicy`` model (:mod:`jitserve.policy` imports these): environment
variables from Secrets, ConfigMaps or pod fields (a gated model's token never sits in the
policy in plain text), scheduling (nodeSelector, tolerations, affinity, runtime and
priority class), image pull Secrets, extra volumes and mounts, and a persistent model cache
instead of an ``emptyDir``. Wire names are camelCase and follow the Kubernetes Pod API, so
an SRE can paste from a Pod spec. Cross-field rules are CEL ``x-kubernetes-validations``
on the models (:func:`~jitserve.policy.base.cel`) and, the same rules in Python,
:func:`pod_problems`; what CEL cannot see (the volume source of an open-ended volume) is
:func:`pod_webhook_problems`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field

from jitserve.policy.base import SpecModel as _Model
from jitserve.policy.base import cel

DNSSubdomain = Annotated[
    str,
    Field(
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
    ),
]
VolumeName = Annotated[
    str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]
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

# Volumes and mount paths the operator itself puts into the serving pod.
RESERVED_VOLUMES = ("config", "api-keys", "cache", "tmp", "dshm")
RESERVED_MOUNT_PATHS = ("/cache", "/tmp", "/dev/shm", "/etc/jitserve", "/etc/jitserve-keys")
# Labels the operator sets on the serving pods (selectors depend on them).
RESERVED_LABEL_PREFIXES = ("app.kubernetes.io/", "jitserve.io/")


def _cel_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{x}'" for x in items) + "]"


class KeyRef(_Model):
    """A key of a Secret or ConfigMap in the policy's namespace."""

    name: DNSSubdomain = Field(description="Name of the Secret or ConfigMap.")
    key: str = Field(min_length=1, max_length=253, description="The key to read.")
    optional: bool | None = Field(
        default=None, description="Start the container even when the key is missing."
    )


class FieldRef(_Model):
    """A field of the pod itself (the downward API)."""

    field_path: str = Field(
        min_length=1,
        max_length=253,
        description="Pod field, e.g. metadata.name, metadata.namespace, status.podIP.",
    )


class EnvVarSource(_Model):
    """Where an environment variable's value comes from; exactly one source."""

    model_config = cel(
        (
            "(has(self.secretKeyRef) ? 1 : 0) + (has(self.configMapKeyRef) ? 1 : 0)"
            " + (has(self.fieldRef) ? 1 : 0) == 1",
            "exactly one of secretKeyRef, configMapKeyRef, fieldRef",
        )
    )

    secret_key_ref: KeyRef | None = Field(
        default=None, description="A key of a Secret (e.g. the HF_TOKEN of a gated model)."
    )
    config_map_key_ref: KeyRef | None = Field(default=None, description="A key of a ConfigMap.")
    field_ref: FieldRef | None = Field(default=None, description="A field of the pod.")

    def sources(self) -> int:
        refs = (self.secret_key_ref, self.config_map_key_ref, self.field_ref)
        return sum(x is not None for x in refs)


class EnvVar(_Model):
    """An environment variable of the vLLM container: a plain value or a reference."""

    model_config = cel(
        (
            "!has(self.valueFrom) || !has(self.value) || self.value == ''",
            "set value or valueFrom, not both",
        )
    )

    name: EnvName = Field(description="Variable name.")
    value: str = Field(default="", description="Plain value (leave empty with valueFrom).")
    value_from: EnvVarSource | None = Field(
        default=None, description="Read the value from a Secret, a ConfigMap or the pod."
    )

    def to_k8s(self) -> dict[str, Any]:
        """The Kubernetes EnvVar object."""
        if self.value_from is None:
            return {"name": self.name, "value": self.value}
        source = self.value_from.model_dump(mode="json", by_alias=True, exclude_none=True)
        return {"name": self.name, "valueFrom": source}


class TolerationOperator(StrEnum):
    EXISTS = "Exists"
    EQUAL = "Equal"


class TaintEffect(StrEnum):
    NO_SCHEDULE = "NoSchedule"
    PREFER_NO_SCHEDULE = "PreferNoSchedule"
    NO_EXECUTE = "NoExecute"


class Toleration(_Model):
    """A toleration of the serving pods (Kubernetes core/v1 Toleration)."""

    key: str | None = Field(
        default=None, max_length=316, description="Taint key; empty with Exists = every taint."
    )
    operator: TolerationOperator | None = Field(
        default=None, description="Exists or Equal (the default)."
    )
    value: str | None = Field(default=None, max_length=63, description="Taint value (Equal).")
    effect: TaintEffect | None = Field(
        default=None, description="NoSchedule, PreferNoSchedule or NoExecute; empty = all."
    )
    toleration_seconds: int | None = Field(
        default=None, ge=0, description="NoExecute only: how long the pod stays after the taint."
    )


class LocalObjectReference(_Model):
    """A Secret in the policy's namespace, by name."""

    name: DNSSubdomain = Field(description="Name of the Secret.")


class ExtraVolume(_Model):
    """A volume of the serving pod, as in a Kubernetes Pod spec: a ``name`` and one volume
    source (secret, configMap, persistentVolumeClaim, csi, nfs, ...), passed on verbatim."""

    model_config = cel(
        (
            f"!(self.name in {_cel_list(RESERVED_VOLUMES)})",
            "pod.volumes[].name: the operator's own volume",
        ),
        extra="allow",
    )

    name: VolumeName = Field(description="Volume name, referred to by volumeMounts.")

    def source_keys(self) -> list[str]:
        return sorted((self.model_extra or {}).keys())

    def to_k8s(self) -> dict[str, Any]:
        return {"name": self.name, **(self.model_extra or {})}


class VolumeMount(_Model):
    """Where a volume appears in the vLLM container."""

    model_config = cel(
        (
            "!self.mountPath.matches('^(" + "|".join(RESERVED_MOUNT_PATHS) + ")/*$')",
            "model.volumeMounts[].mountPath: the operator's own path",
        )
    )

    name: VolumeName = Field(description="A volume of pod.volumes.")
    mount_path: str = Field(
        min_length=2, max_length=1024, pattern=r"^/", description="Absolute path in the container."
    )
    read_only: bool = Field(default=False, description="Mount read-only.")
    sub_path: str | None = Field(
        default=None, max_length=1024, description="Mount only this path within the volume."
    )

    def to_k8s(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class CacheAccessMode(StrEnum):
    READ_WRITE_ONCE = "ReadWriteOnce"
    READ_WRITE_MANY = "ReadWriteMany"


class ModelCache(_Model):
    """A PersistentVolumeClaim for the model cache (HF_HOME) instead of an emptyDir, so a
    restarted pod does not download the model again."""

    model_config = cel(
        (
            "!has(self.existingClaim) || !has(self.storageClassName)",
            "model.cache.storageClassName: only for a claim the operator makes "
            "(not existingClaim)",
        )
    )

    existing_claim: DNSSubdomain | None = Field(
        default=None,
        description="Use this claim (made by you, kept after the policy) instead of making one.",
    )
    size: Quantity = Field(default="100Gi", description="Size of the claim the operator makes.")
    storage_class_name: str | None = Field(
        default=None, max_length=253, description="StorageClass of that claim; empty = default."
    )
    access_mode: CacheAccessMode = Field(
        default=CacheAccessMode.READ_WRITE_ONCE,
        description=(
            "ReadWriteOnce: one node mounts it (pods of several replicas must share a node);"
            " ReadWriteMany: replicas on different nodes share it (needs such a StorageClass)."
        ),
    )


class PodSettings(_Model):
    """Scheduling and pod-level settings of the serving pods (changing them rolls pods)."""

    model_config = cel(
        (
            "self.labels.all(k, "
            + " && ".join(f"!k.startsWith('{p}')" for p in RESERVED_LABEL_PREFIXES)
            + ")",
            "pod.labels: app.kubernetes.io/* and jitserve.io/* are the operator's own labels",
        )
    )

    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the pods must land on."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=64, description="Taints the pods tolerate."
    )
    affinity: dict[str, Any] | None = Field(
        default=None,
        description="Kubernetes core/v1 Affinity (nodeAffinity, podAffinity, podAntiAffinity), "
        "passed on verbatim.",
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, max_length=16, description="Secrets for pulling the vLLM image."
    )
    runtime_class_name: DNSSubdomain | None = Field(
        default=None, description="RuntimeClass of the pods (e.g. nvidia)."
    )
    priority_class_name: DNSSubdomain | None = Field(
        default=None, description="PriorityClass of the pods."
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        max_length=64,
        description="Extra pod labels (not app.kubernetes.io/* or jitserve.io/*: the "
        "operator's own).",
    )
    annotations: dict[str, str] = Field(default_factory=dict, description="Extra pod annotations.")
    volumes: list[ExtraVolume] = Field(
        default_factory=list,
        max_length=64,
        description="Extra pod volumes (mount them with model.volumeMounts).",
    )


def pod_webhook_problems(pod: PodSettings) -> list[str]:
    """What no CEL rule can check: a volume's source is among the fields the schema leaves
    open (``x-kubernetes-preserve-unknown-fields``), which CEL does not see."""
    return [
        f"pod.volumes[{i}]: needs exactly one volume source (e.g. secret, "
        f"persistentVolumeClaim), got {vol.source_keys() or 'none'}"
        for i, vol in enumerate(pod.volumes)
        if len(vol.source_keys()) != 1
    ]


def pod_problems(
    env: list[EnvVar], mounts: list[VolumeMount], pod: PodSettings, cache: ModelCache | None
) -> list[str]:
    """The pod rules the CRD's CEL rules state, each naming its field (wire path from spec)."""
    problems: list[str] = []
    for i, var in enumerate(env):
        where = f"model.env[{i}]"
        if var.value_from is not None:
            if var.value:
                problems.append(f"{where}.valueFrom: set value or valueFrom, not both")
            if var.value_from.sources() != 1:
                problems.append(
                    f"{where}.valueFrom: exactly one of secretKeyRef, configMapKeyRef, fieldRef"
                )
    declared = {v.name for v in pod.volumes}
    for i, vol in enumerate(pod.volumes):
        if vol.name in RESERVED_VOLUMES:
            problems.append(f"pod.volumes[{i}].name: {vol.name!r} is the operator's own volume")
    usable = declared | {"cache"}
    for i, mount in enumerate(mounts):
        if mount.name not in usable:
            problems.append(
                f"model.volumeMounts[{i}].name: no volume {mount.name!r} in pod.volumes"
            )
        if mount.mount_path.rstrip("/") in RESERVED_MOUNT_PATHS:
            problems.append(
                f"model.volumeMounts[{i}].mountPath: {mount.mount_path} is the operator's own"
            )
    for key in sorted(pod.labels):
        if key.startswith(RESERVED_LABEL_PREFIXES):
            problems.append(f"pod.labels.{key}: the operator's own label")
    if cache is not None and cache.existing_claim and cache.storage_class_name:
        problems.append(
            "model.cache.storageClassName: only for a claim the operator makes (not existingClaim)"
        )
    return problems
