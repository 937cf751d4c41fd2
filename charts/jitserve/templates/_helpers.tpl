{{- define "jitserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "jitserve.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
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

{{- define "jitserve.webhookName" -}}
{{- printf "%s-webhook" (include "jitserve.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "jitserve.webhookSecretName" -}}
{{- default (printf "%s-webhook-tls" (include "jitserve.fullname" .) | trunc 63 | trimSuffix "-") .Values.webhook.certSecret -}}
{{- end -}}

{{/* name:tag of a child image; the tag defaults to the chart's appVersion. */}}
{{- define "jitserve.childImage" -}}
{{- printf "%s:%s" .image.repository (.image.tag | default .root.Chart.AppVersion) -}}
{{- end -}}

{{/* The namespaces the operator watches (not clusterWide): the list, or the release's. */}}
{{- define "jitserve.namespaces" -}}
{{- if .Values.watchNamespaces -}}
{{- toJson .Values.watchNamespaces -}}
{{- else -}}
{{- toJson (list .Release.Namespace) -}}
{{- end -}}
{{- end -}}

{{- define "jitserve.labels" -}}
app.kubernetes.io/name: {{ include "jitserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "jitserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "jitserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* The endpoint picker's pods (inferencePool.enabled): the operator's NetworkPolicy of the
policy admits pods with these component and policy labels to the sidecars' admin port. */}}
{{- define "jitserve.pickerSelector" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: picker
jitserve.io/policy: {{ .Values.inferencePool.policy }}
{{- end -}}

{{- define "jitserve.pickerLabels" -}}
app.kubernetes.io/name: {{ include "jitserve.name" . }}
{{ include "jitserve.pickerSelector" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The operator's permissions: least privilege, the same rules for a ClusterRole or a Role.
Children are written with server-side apply (PATCH; creating one by apply also needs create). */}}
{{- define "jitserve.rules" -}}
# SLOPolicy objects: watch them; patch = kopf's bookkeeping annotations, and spec.replicas
# when spec.autoscaling is enabled (the scale an HPA would write).
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
# Children: created and kept in shape; deletion is the garbage collector's (ownerReferences),
# but for the fleet's gateway (its Deployment and Services), deleted when spec.replicas goes
# back to one pod.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["configmaps", "persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "patch"]
# The optional Ingress is deleted when spec.ingress is removed.
- apiGroups: ["networking.k8s.io"]
  resources: ["ingresses"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The serving pods' NetworkPolicy (clients reach only the sidecar's API port).
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Tenants' API keys: read the Secrets named in spec.fairness.tenants[].apiKeySecret, and
# keep their copy in the policy's "<name>-api-keys" Secret (mounted by the sidecar).
# No list/watch: key rotation is picked up by the periodic resync.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create", "patch"]
# Serving pods: found by label to read each sidecar's /metrics and report their readiness;
# before autoscaling scales down, annotated with their pod-deletion-cost (patch).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "patch"]
# Events about SLOPolicy objects (kopf posts handler failures).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end -}}
