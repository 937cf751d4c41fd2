"""The ``SLOPolicy`` settings model's one public face: import it from here.

One pydantic model validates the ``SLOPolicy`` custom resource (its CRD schema is
generated from it), the sidecar's config file and the simulator's settings. Its sections
live in this package's modules, each importing only the ones below it:

- :mod:`~jitserve.policy.spec`: ``SLOPolicySpec`` itself (fairness, admission, limits)
  and its loaders;
- :mod:`~jitserve.policy.serving`: the model, sidecar, Ingress and reporting sections;
- :mod:`~jitserve.policy.pod`, :mod:`~jitserve.policy.scheduler`,
  :mod:`~jitserve.policy.slo`, :mod:`~jitserve.policy.status`: pod knobs, GMAX's
  settings, SLO defaults and classes, the resource's ``status``;
- :mod:`~jitserve.policy.batch`: the pod's batch shape (vLLM's B, the engine queue);
- :mod:`~jitserve.policy.base`: the building blocks every section shares.

Importers outside the package name only :mod:`jitserve.policy`.
"""

from __future__ import annotations

from jitserve.policy.autoscaling import AutoscalingSettings
from jitserve.policy.batch import (
    GPU_MAX_NUM_SEQS,
    MAX_NUM_SEQS,
    ArgsError,
    BatchShape,
    batch_shape,
    default_engine_queue,
    flag_value,
    parallel_args,
)
from jitserve.policy.contract import BeyondContract, ClaimBounds
from jitserve.policy.pod import PodSettings
from jitserve.policy.scheduler import (
    AUTO,
    AUTO_CANDIDATES,
    AutoSettings,
    BudgetRule,
    CutoffMode,
    CutoffSettings,
    MechanismSettings,
    Objective,
    PreemptionSettings,
    SchedulerSettings,
)
from jitserve.policy.serving import (
    IngressSpec,
    ModelSpec,
    PullPolicy,
    ReportingSettings,
    SidecarSpec,
)
from jitserve.policy.slo import LatencyDefaults, SLOClass, SLODefaults
from jitserve.policy.spec import (
    AdmissionSettings,
    FairnessSettings,
    LimitsSettings,
    MaxWaitingRetires,
    OverloadAction,
    PolicyError,
    SLOPolicySpec,
    TenantSpec,
    dump_policy_yaml,
    load_policy,
    load_policy_file,
)
from jitserve.policy.status import (
    MAX_REPLICA_STATUS,
    Attainment,
    AutoscalingStatus,
    Condition,
    ConditionType,
    FairnessStatus,
    GatewayStatus,
    ReplicaStatus,
    SLOPolicyStatus,
    TenantShare,
)

__all__ = [
    "AUTO",
    "AUTO_CANDIDATES",
    "GPU_MAX_NUM_SEQS",
    "MAX_NUM_SEQS",
    "MAX_REPLICA_STATUS",
    "AdmissionSettings",
    "ArgsError",
    "Attainment",
    "AutoSettings",
    "AutoscalingSettings",
    "AutoscalingStatus",
    "BatchShape",
    "BeyondContract",
    "BudgetRule",
    "ClaimBounds",
    "Condition",
    "ConditionType",
    "CutoffMode",
    "CutoffSettings",
    "FairnessSettings",
    "FairnessStatus",
    "GatewayStatus",
    "IngressSpec",
    "LatencyDefaults",
    "LimitsSettings",
    "MaxWaitingRetires",
    "MechanismSettings",
    "ModelSpec",
    "Objective",
    "OverloadAction",
    "PodSettings",
    "PolicyError",
    "PreemptionSettings",
    "PullPolicy",
    "ReplicaStatus",
    "ReportingSettings",
    "SLOClass",
    "SLODefaults",
    "SLOPolicySpec",
    "SLOPolicyStatus",
    "SchedulerSettings",
    "SidecarSpec",
    "TenantShare",
    "TenantSpec",
    "batch_shape",
    "default_engine_queue",
    "dump_policy_yaml",
    "flag_value",
    "load_policy",
    "load_policy_file",
    "parallel_args",
]
