"""Pure builders of the namespace's shared analyzer: PVC, Deployment and Service.

Owned by every SLOPolicy in the namespace, none of them the controller, so the garbage
collector removes them with the last policy. Split from :mod:`builders` (the per-policy
children) to keep each module small.
"""

from __future__ import annotations

from jitserve.operator import constants as c
from jitserve.operator.builders import (
    CONTAINER_SECURITY,
    JSON,
    OperatorSettings,
    PolicyRef,
    pod_hardening,
    resources,
)


def _analyzer_meta(namespace: str, owners: list[PolicyRef]) -> JSON:
    return {
        "name": c.ANALYZER_NAME,
        "namespace": namespace,
        "labels": {
            c.LABEL_NAME: "jitserve",
            c.LABEL_INSTANCE: c.ANALYZER_NAME,
            c.LABEL_COMPONENT: "analyzer",
            c.LABEL_MANAGED_BY: c.MANAGED_BY,
        },
        "ownerReferences": [
            o.owner_reference(controller=False) for o in sorted(owners, key=lambda o: o.uid)
        ],
    }


def analyzer_selector() -> dict[str, str]:
    return {c.LABEL_INSTANCE: c.ANALYZER_NAME, c.LABEL_COMPONENT: "analyzer"}


def build_analyzer_children(
    namespace: str, owners: list[PolicyRef], settings: OperatorSettings
) -> list[JSON]:
    """PVC (pattern-graph and length history), Deployment and Service of the analyzer.

    Owned by every policy in the namespace, none of them the controller: the garbage
    collector deletes them only when the last owner is gone.
    """
    meta = _analyzer_meta(namespace, owners)
    pvc_spec: JSON = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": settings.analyzer_storage}},
    }
    if settings.analyzer_storage_class:
        pvc_spec["storageClassName"] = settings.analyzer_storage_class
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": pvc_spec}
    container: JSON = {
        "name": "analyzer",
        "image": settings.analyzer_image,
        "imagePullPolicy": settings.image_pull_policy,
        "args": [
            *("analyzer", "serve", "--host", "0.0.0.0", "--port", str(c.ANALYZER_PORT)),
            *("--metrics-port", str(c.ANALYZER_METRICS_PORT)),
            *("--state-dir", "/var/lib/jitserve-analyzer"),
        ],
        "ports": [
            {"name": "grpc", "containerPort": c.ANALYZER_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": c.ANALYZER_METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": resources("1", "2Gi"),
        # tcpSocket, not grpc: gRPC probes need Kubernetes 1.24+ (the chart supports 1.20+).
        # TCP passes before the model is loaded; sidecars fall back to their own bound then.
        "readinessProbe": {"tcpSocket": {"port": "grpc"}, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": "grpc"}, "periodSeconds": 20},
        "securityContext": {**CONTAINER_SECURITY, "readOnlyRootFilesystem": True},
        "volumeMounts": [
            {"name": "state", "mountPath": "/var/lib/jitserve-analyzer"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": analyzer_selector()},
            # One writer of the volume at a time.
            "strategy": {"type": "Recreate"},
            "template": {
                "metadata": {"labels": {**meta["labels"], **analyzer_selector()}},
                "spec": {
                    **pod_hardening(),
                    "containers": [container],
                    "volumes": [
                        {"name": "state", "persistentVolumeClaim": {"claimName": c.ANALYZER_NAME}},
                        {"name": "tmp", "emptyDir": {}},
                    ],
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "type": "ClusterIP",
            "selector": analyzer_selector(),
            "ports": [
                {"name": "grpc", "port": c.ANALYZER_PORT, "targetPort": "grpc", "protocol": "TCP"},
                {
                    "name": "metrics",
                    "port": c.ANALYZER_METRICS_PORT,
                    "targetPort": "metrics",
                    "protocol": "TCP",
                },
            ],
        },
    }
    return [pvc, service, deployment]
