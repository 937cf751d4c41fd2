"""Pure builders of a fleet's gateway (``spec.replicas`` > 1): its Deployment and Service,
and the headless Service through which it finds the serving pods (owner: operator).

With more than one serving pod, ``jitserve gateway`` (two replicas, stateless) places
each request on one pod from the pods' reports (``--placement power-of-k``), finding them
as the A records of the headless Service (``--discover HOST:API_PORT:ADMIN_PORT``:
their sidecars' API and admin ports), and the Ingress routes to the gateway's Service
instead of the pods'. The gateway reads the policy's ConfigMap (the SLO classes and
defaults every request is placed with), hot-reloaded as the sidecars do. It runs the
sidecar image (the same ``jitserve`` with the web stack). With one pod nothing of this
exists: the Ingress goes to the pods' Service as before.
"""

from __future__ import annotations

from jitserve.operator import constants as c
from jitserve.operator.naming import (
    JSON,
    PolicyRef,
    child_meta,
    config_map_name,
    gateway_name,
    gateway_selector,
    labels,
    replicas_service_name,
    selector_labels,
    uses_gateway,
)
from jitserve.operator.pods import CONTAINER_SECURITY, OperatorSettings, pod_hardening, resources
from jitserve.policy import SLOPolicySpec


def discover_target(ref: PolicyRef, spec: SLOPolicySpec) -> str:
    """``--discover``: the headless Service's name and the sidecars' API and admin ports."""
    host = f"{replicas_service_name(ref.name)}.{ref.namespace}.svc"
    return f"{host}:{spec.sidecar.port}:{spec.sidecar.admin_port}"


def build_replicas_service(ref: PolicyRef, spec: SLOPolicySpec) -> JSON:
    """Headless: no virtual IP, one A record per ready serving pod. Only the API port is
    named (the admin port stays out of every Service); the gateway gets both ports from
    its ``--discover``."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_meta(ref, replicas_service_name(ref.name), "serving"),
        "spec": {
            "clusterIP": "None",
            "selector": selector_labels(ref.name),
            "ports": [{"name": "http", "port": spec.sidecar.port, "targetPort": "http",
                       "protocol": "TCP"}],
        },
    }


def build_gateway_service(ref: PolicyRef) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_meta(ref, gateway_name(ref.name), "gateway"),
        "spec": {
            "type": "ClusterIP",
            "selector": gateway_selector(ref.name),
            "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def build_gateway_deployment(ref: PolicyRef, spec: SLOPolicySpec,
                             settings: OperatorSettings) -> JSON:
    container: JSON = {
        "name": "gateway",
        "image": settings.sidecar_image,
        "imagePullPolicy": settings.image_pull_policy,
        "args": [
            *("gateway", "--host", "0.0.0.0", "--port", str(c.GATEWAY_PORT)),
            *("--admin-port", str(c.GATEWAY_ADMIN_PORT)),
            *("--config", f"{c.CONFIG_DIR}/{c.CONFIG_KEY}"),
            *("--discover", discover_target(ref, spec)),
            *("--placement", c.GATEWAY_PLACEMENT),
        ],
        "ports": [
            {"name": "http", "containerPort": c.GATEWAY_PORT, "protocol": "TCP"},
            {"name": c.ADMIN_PORT_NAME, "containerPort": c.GATEWAY_ADMIN_PORT,
             "protocol": "TCP"},
        ],
        "resources": resources("500m", "512Mi"),
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": c.ADMIN_PORT_NAME},
            "periodSeconds": 5,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": c.ADMIN_PORT_NAME},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "securityContext": {**CONTAINER_SECURITY, "readOnlyRootFilesystem": True},
        "volumeMounts": [{"name": "config", "mountPath": c.CONFIG_DIR, "readOnly": True}],
    }
    selector = gateway_selector(ref.name)
    pod_labels = {**labels(ref.name, "gateway"), **selector}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_meta(ref, gateway_name(ref.name), "gateway"),
        "spec": {
            "replicas": c.GATEWAY_REPLICAS,
            "selector": {"matchLabels": selector},
            # never fewer than the replicas asked for while a new version rolls out
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {
                    "labels": pod_labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(c.GATEWAY_ADMIN_PORT),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    **pod_hardening(),
                    "containers": [container],
                    "volumes": [{"name": "config",
                                 "configMap": {"name": config_map_name(ref.name)}}],
                    # two replicas on two nodes when there are two
                    "affinity": {"podAntiAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [{
                            "weight": 100,
                            "podAffinityTerm": {
                                "labelSelector": {"matchLabels": selector},
                                "topologyKey": "kubernetes.io/hostname",
                            },
                        }],
                    }},
                },
            },
        },
    }


def build_gateway_children(ref: PolicyRef, spec: SLOPolicySpec,
                           settings: OperatorSettings) -> list[JSON]:
    """The headless Service, the gateway's Service and Deployment; none with one pod."""
    if not uses_gateway(spec.replicas):
        return []
    return [build_replicas_service(ref, spec), build_gateway_service(ref),
            build_gateway_deployment(ref, spec, settings)]


def gateway_children_ids(ref: PolicyRef) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of every gateway child, to remove them when the policy
    goes back to one pod."""
    return [("v1", "Service", replicas_service_name(ref.name)),
            ("v1", "Service", gateway_name(ref.name)),
            ("apps/v1", "Deployment", gateway_name(ref.name))]
