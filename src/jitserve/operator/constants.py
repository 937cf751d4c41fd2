"""Names shared by the CRD, the builders and the handlers."""

from __future__ import annotations

from typing import Final

GROUP: Final = "jitserve.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "SLOPolicy"
PLURAL: Final = "slopolicies"
SINGULAR: Final = "slopolicy"
SHORT_NAMES: Final = ("slop",)
CRD_NAME: Final = f"{PLURAL}.{GROUP}"

FIELD_MANAGER: Final = "jitserve-operator"
MANAGED_BY: Final = "jitserve-operator"

# Labels on every child object.
LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_POLICY: Final = f"{GROUP}/policy"

# The sidecar's admin port (metrics, /debug/scheduler): in no Service, no Ingress.
ADMIN_PORT_NAME: Final = "admin"
# Set by the API server on every namespace (Kubernetes >= 1.21).
NAMESPACE_NAME_LABEL: Final = "kubernetes.io/metadata.name"

CONFIG_KEY: Final = "policy.yaml"
CONFIG_DIR: Final = "/etc/jitserve"
KEYS_DIR: Final = "/etc/jitserve-keys"

ANALYZER_NAME: Final = "jitserve-analyzer"
ANALYZER_PORT: Final = 50051
ANALYZER_METRICS_PORT: Final = 9464

# The fleet's gateway (spec.replicas > 1): `jitserve gateway` in front of the serving pods.
GATEWAY_REPLICAS: Final = 2
GATEWAY_PORT: Final = 8000
GATEWAY_ADMIN_PORT: Final = 9000
GATEWAY_PLACEMENT: Final = "power-of-k"
PLACER_COMPONENTS: Final = ("gateway", "picker")
"""The components (``app.kubernetes.io/component``) that read the sidecars' replica
reports on their admin port: the operator's gateway and the chart's endpoint picker."""
