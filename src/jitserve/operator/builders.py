"""Pure functions from an ``SLOPolicy`` to each child object (plain dicts, wire format).

The children's names and labels are :mod:`naming`'s, the Service, Ingress and
NetworkPolicy :mod:`routing`'s, the fleet's gateway (``spec.replicas`` > 1)
:mod:`gateway_builders`'; this module builds the rest and the whole list.

Nothing here talks to a cluster. Rules the tests pin down:
- the pod template depends only on the serving fields (``model``, ``sidecar``, ``pod``)
  and the operator's images, never on scheduler/fairness/SLO/admission settings, so tuning ``p``
  or ``f`` changes only the ConfigMap, which the sidecar hot-reloads (no restart);
- every object carries the same labels and an ownerReference to its policy (the analyzer
  objects: one to every policy in the namespace, so the garbage collector removes them
  with the last one).
"""

from __future__ import annotations

from jitserve.engine.wire import RULE_ENV, engine_scheduler_flags
from jitserve.operator import constants as c
from jitserve.operator.gateway_builders import build_gateway_children
from jitserve.operator.naming import (
    JSON,
    MAX_NAME,
    PolicyRef,
    api_keys_secret_name,
    child_meta,
    config_map_name,
    labels,
    name_problems,
    selector_labels,
    selector_string,
    uses_gateway,
)
from jitserve.operator.pods import CONTAINER_SECURITY, OperatorSettings, pod_hardening, resources
from jitserve.operator.routing import build_ingress, build_network_policy, build_service
from jitserve.policy import BudgetRule, SLOPolicySpec, dump_policy_yaml

# the children's identity, routing and shared pod settings live in naming, routing and
# pods; builders is their face
__all__ = [
    "CONTAINER_SECURITY",
    "JSON",
    "MAX_NAME",
    "OperatorSettings",
    "PolicyRef",
    "api_keys_secret_name",
    "build_ingress",
    "build_network_policy",
    "build_service",
    "config_map_name",
    "labels",
    "name_problems",
    "pod_hardening",
    "resources",
    "selector_labels",
    "selector_string",
    "uses_gateway",
    "watcher_namespaces",
]


def model_cache_claim_name(policy: str, spec: SLOPolicySpec) -> str | None:
    """The claim mounted at /cache: the user's ``existingClaim``, ours, or None (emptyDir)."""
    cache = spec.model.cache
    if cache is None:
        return None
    return cache.existing_claim or f"{policy}-model-cache"


def build_config_map(ref: PolicyRef, spec: SLOPolicySpec) -> JSON:
    """The sidecar's config file, ``policy.yaml`` = :func:`dump_policy_yaml`."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_meta(ref, config_map_name(ref.name), "config"),
        "data": {c.CONFIG_KEY: dump_policy_yaml(spec)},
    }


def build_api_keys_secret(ref: PolicyRef, keys: dict[str, str]) -> JSON:
    """Tenants' API keys, copied from the Secrets ``fairness.tenants[].apiKeySecret`` names.

    ``keys`` maps each such Secret's name to its ``api-key`` value (base64, as read). The
    sidecar finds them at ``KEYS_DIR/<apiKeySecret>``. One Secret with a fixed name, so
    adding a tenant changes this Secret, not the pod template (no restart).
    """
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": child_meta(ref, api_keys_secret_name(ref.name), "config"),
        "data": dict(sorted(keys.items())),
    }


def analyzer_address(namespace: str) -> str:
    return f"{c.ANALYZER_NAME}.{namespace}.svc:{c.ANALYZER_PORT}"


def build_pod_template(ref: PolicyRef, spec: SLOPolicySpec, settings: OperatorSettings) -> JSON:
    """vLLM + scheduler sidecar. Reads only ``spec.model``, ``spec.sidecar``, ``spec.pod``
    and settings."""
    model = spec.model
    side = spec.sidecar
    pod = spec.pod
    shape = model.batch_shape(side.engine_queue)
    vllm_args = [  # `vllm serve MODEL`: the entrypoint of vLLM's own image
        *(model.loaded, "--served-model-name", model.served_name),
        *("--host", "0.0.0.0", "--port", str(model.port)),
        *("--scheduling-policy", "priority"),
        *model.vllm_args(),
    ]
    rule = spec.scheduler.budget_rule
    engine_env = []
    if rule is not BudgetRule.FIXED:  # the image must have jitserve importable (no deps)
        vllm_args += engine_scheduler_flags("--async-scheduling" in model.args)
        engine_env = [{"name": RULE_ENV, "value": rule.value}]
    gpu_limits = {model.gpu_resource: str(model.gpus)} if model.gpus > 0 else {}
    vllm: JSON = {
        "name": "vllm",
        "image": model.image,
        "imagePullPolicy": model.image_pull_policy.value,
        "command": ["vllm", "serve"],
        "args": vllm_args,
        "env": [
            {"name": "HOME", "value": "/tmp"},
            {"name": "HF_HOME", "value": "/cache/huggingface"},
            *engine_env,
            *(e.to_k8s() for e in model.env),
        ],
        "ports": [{"name": "vllm", "containerPort": model.port, "protocol": "TCP"}],
        "resources": resources(model.cpu, model.memory, gpu_limits),
        # Model loading can take long: the startup probe allows startupSeconds, then
        # liveness takes over. Readiness is the sidecar's (it checks vLLM).
        "startupProbe": {
            "httpGet": {"path": "/health", "port": "vllm"},
            "periodSeconds": 10,
            "failureThreshold": max(1, model.startup_seconds // 10),
        },
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": "vllm"},
            "periodSeconds": 20,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "securityContext": dict(CONTAINER_SECURITY),
        "volumeMounts": [
            {"name": "cache", "mountPath": "/cache"},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "dshm", "mountPath": "/dev/shm"},
            *(m.to_k8s() for m in model.volume_mounts),
        ],
    }
    sidecar: JSON = {
        "name": "sidecar",
        "image": settings.sidecar_image,
        "imagePullPolicy": settings.image_pull_policy,
        "args": [
            *("sidecar", "serve"),
            *("--config", f"{c.CONFIG_DIR}/{c.CONFIG_KEY}"),
            *("--host", "0.0.0.0", "--port", str(side.port)),
            *("--backend", f"http://127.0.0.1:{model.port}"),
            *shape.sidecar_args(),
            *("--admin-port", str(side.admin_port), "--policy-name", ref.name),
            *("--analyzer", analyzer_address(ref.namespace)),
            *("--keys-dir", c.KEYS_DIR),
        ],
        "ports": [
            {"name": "http", "containerPort": side.port, "protocol": "TCP"},
            {"name": c.ADMIN_PORT_NAME, "containerPort": side.admin_port, "protocol": "TCP"},
        ],
        "resources": resources(side.cpu, side.memory),
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": "http"},
            "periodSeconds": 5,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "securityContext": {**CONTAINER_SECURITY, "readOnlyRootFilesystem": True},
        # A directory mount (not subPath) so the kubelet updates the file in place and
        # the sidecar hot-reloads it.
        "volumeMounts": [
            {"name": "config", "mountPath": c.CONFIG_DIR, "readOnly": True},
            {"name": "api-keys", "mountPath": c.KEYS_DIR, "readOnly": True},
        ],
    }
    claim = model_cache_claim_name(ref.name, spec)
    cache: JSON = {"persistentVolumeClaim": {"claimName": claim}} if claim else {"emptyDir": {}}
    pod_spec: JSON = {
        **pod_hardening(),
        "terminationGracePeriodSeconds": 60,
        "containers": [vllm, sidecar],
        "volumes": [
            {"name": "config", "configMap": {"name": config_map_name(ref.name)}},
            {
                "name": "api-keys",
                "secret": {"secretName": api_keys_secret_name(ref.name), "optional": True},
            },
            {"name": "cache", **cache},
            {"name": "tmp", "emptyDir": {}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": model.shm_size}},
            *(v.to_k8s() for v in pod.volumes),
        ],
    }
    if pod.node_selector:
        pod_spec["nodeSelector"] = dict(sorted(pod.node_selector.items()))
    if pod.tolerations:
        pod_spec["tolerations"] = [
            t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in pod.tolerations
        ]
    if pod.affinity:
        pod_spec["affinity"] = pod.affinity
    if pod.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s.name} for s in pod.image_pull_secrets]
    if pod.runtime_class_name:
        pod_spec["runtimeClassName"] = pod.runtime_class_name
    if pod.priority_class_name:
        pod_spec["priorityClassName"] = pod.priority_class_name
    return {
        "metadata": {
            "labels": {
                **dict(sorted(pod.labels.items())),
                **labels(ref.name, "serving"),
                **selector_labels(ref.name),
            },
            "annotations": {
                **dict(sorted(pod.annotations.items())),
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(side.admin_port),
                "prometheus.io/path": "/metrics",
            },
        },
        "spec": pod_spec,
    }


def build_deployment(ref: PolicyRef, spec: SLOPolicySpec, settings: OperatorSettings) -> JSON:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_meta(ref, ref.name, "serving"),
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": selector_labels(ref.name)},
            # One GPU pod at a time: never ask for a surge replica's accelerators.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
            },
            "template": build_pod_template(ref, spec, settings),
        },
    }


def build_model_cache_claim(ref: PolicyRef, spec: SLOPolicySpec) -> JSON | None:
    """The model cache's PersistentVolumeClaim, unless absent or the user's own claim."""
    cache = spec.model.cache
    if cache is None or cache.existing_claim:
        return None
    claim: JSON = {
        "accessModes": [cache.access_mode.value],
        "resources": {"requests": {"storage": cache.size}},
    }
    if cache.storage_class_name:
        claim["storageClassName"] = cache.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": child_meta(ref, f"{ref.name}-model-cache", "model-cache"),
        "spec": claim,
    }


def watcher_namespaces(settings: OperatorSettings) -> list[str]:
    """Namespaces the NetworkPolicy admits to the admin and vLLM ports: Prometheus's and
    the operator's own (its status scrape)."""
    namespaces = [settings.monitoring_namespace]
    if settings.operator_namespace and settings.operator_namespace not in namespaces:
        namespaces.append(settings.operator_namespace)
    return namespaces


def build_policy_children(
    ref: PolicyRef,
    spec: SLOPolicySpec,
    settings: OperatorSettings,
    keys: dict[str, str] | None = None,
) -> list[JSON]:
    """The per-policy children in creation order (config first: the pods mount it).

    ``keys``: tenant API keys by Secret name (see :func:`build_api_keys_secret`).
    """
    children = [
        build_config_map(ref, spec),
        build_api_keys_secret(ref, keys or {}),
    ]
    claim = build_model_cache_claim(ref, spec)
    if claim is not None:
        children.append(claim)
    children += [
        build_service(ref, spec),
        build_network_policy(ref, watcher_namespaces(settings)),
        build_deployment(ref, spec, settings),
        *build_gateway_children(ref, spec, settings),
    ]
    ingress = build_ingress(ref, spec)
    if ingress is not None:
        children.append(ingress)
    return children
