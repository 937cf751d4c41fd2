{{- define "jitserve.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "jitserve.operatorName" -}}
{{- printf "%s-operator" (include "jitserve.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "jitserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "jitserve.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "jitserve.labels" -}}
app.kubernetes.io/name: jitserve
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "jitserve.selectorLabels" -}}
app.kubernetes.io/name: jitserve
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* The operator's permissions: least privilege, the same rules for a ClusterRole or a Role. */}}
{{- define "jitserve.rules" -}}
# SLOPolicy objects: watch them; patch = kopf's bookkeeping annotations.
- apiGroups: ["jitserve.io"]
  resources: ["slopolicies"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["jitserve.io"]
  resources: ["slopolicies/status"]
  verbs: ["get", "patch"]
# blockOwnerDeletion on children (needed where OwnerReferencesPermissionEnforcement is on).
- apiGroups: ["jitserve.io"]
  resources: ["slopolicies/finalizers"]
  verbs: ["update"]
# Children: created and kept in shape; deletion is the garbage collector's (ownerReferences).
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "update"]
- apiGroups: [""]
  resources: ["configmaps", "services"]
  verbs: ["get", "list", "watch", "create", "update"]
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "patch"]
# The optional Ingress is deleted when spec.ingress is removed.
- apiGroups: ["networking.k8s.io"]
  resources: ["ingresses"]
  verbs: ["get", "list", "watch", "create", "update", "delete"]
# Tenants' API keys: read the Secrets named in spec.fairness.tenants[].apiKeySecret, and
# keep their copy in the policy's "<name>-api-keys" Secret (mounted by the sidecar).
# No list/watch: key rotation is picked up by the periodic resync.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create", "update"]
# Serving pods: found by label to read each sidecar's /metrics.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
# Events about SLOPolicy objects (kopf posts handler failures).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end -}}
