{{/* The Prometheus rule groups (the spec of the PrometheusRule). `promtool check rules` and
`promtool test rules` run on exactly this text (tests/operator/test_operator_monitoring.py).

SLO error ratio of a policy = (missed + retired) / (met + missed + retired) requests, from
the sidecars' jitserve_requests_total; the error budget is 1 - objective. */}}
{{- define "jitserve.ruleGroups" -}}
{{- $pr := .Values.monitoring.prometheusRule }}
{{- $windows := dict }}
{{- range $pr.burnRates }}
{{- $_ := set $windows .long true }}
{{- $_ := set $windows .short true }}
{{- end -}}
groups:
  - name: jitserve-slo.rules
    rules:
      {{- range $w := keys $windows | sortAlpha }}
      - record: jitserve:slo_error_ratio:rate{{ $w }}
        expr: |-
          sum by (namespace, policy) (rate(jitserve_requests_total{outcome=~"missed|retired"}[{{ $w }}]))
          /
          sum by (namespace, policy) (rate(jitserve_requests_total{outcome=~"met|missed|retired"}[{{ $w }}]))
      {{- end }}
  - name: jitserve-slo.alerts
    rules:
      {{- range $br := $pr.burnRates }}
      - alert: JitserveSLOBurnRate{{ $br.name }}
        expr: |-
          jitserve:slo_error_ratio:rate{{ $br.long }} > ({{ $br.factor }} * (1 - {{ $pr.objective }}))
          and
          jitserve:slo_error_ratio:rate{{ $br.short }} > ({{ $br.factor }} * (1 - {{ $pr.objective }}))
        for: {{ $br.for }}
        labels:
          severity: {{ $br.severity }}
        annotations:
          summary: {{`SLOPolicy {{ $labels.namespace }}/{{ $labels.policy }} burns its SLO error budget`}} {{ $br.factor }}x too fast
          description: "{{`{{ $value | humanizePercentage }}`}} of requests missed their SLO over the last {{ $br.long }} (and {{ $br.short }}): {{ $br.factor }}x the error budget of a {{ $pr.objective }} attainment objective."
      {{- end }}
  - name: jitserve-components.alerts
    rules:
      - alert: JitserveBackendDown
        expr: jitserve_backend_up == 0
        for: {{ $pr.backendDownFor }}
        labels:
          severity: critical
        annotations:
          summary: {{`vLLM behind the sidecar {{ $labels.namespace }}/{{ $labels.pod }} does not answer its health check`}}
          description: The sidecar refuses new requests (HTTP 503) until vLLM is back.
      - alert: JitserveTargetDown
        expr: up{jitserve_component!=""} == 0
        for: {{ $pr.targetDownFor }}
        labels:
          severity: warning
        annotations:
          summary: {{`jitserve {{ $labels.jitserve_component }} {{ $labels.namespace }}/{{ $labels.pod }} cannot be scraped`}}
          description: Its /metrics endpoint does not answer; the dashboards and SLO alerts are blind to it.
      - alert: JitservePolicyDegraded
        expr: jitserve_operator_policy_degraded == 1
        for: 10m
        labels:
          severity: warning
        annotations:
          summary: {{`SLOPolicy {{ $labels.namespace }}/{{ $labels.policy }} is Degraded`}}
          description: Invalid spec or children that cannot be applied; see kubectl describe slopolicy.
      - alert: JitserveOperatorReconcileErrors
        expr: sum(rate(jitserve_operator_reconciles_total{result="error"}[10m])) > 0
        for: 15m
        labels:
          severity: warning
        annotations:
          summary: The jitserve operator keeps failing to reconcile
          description: See the operator's log and the Degraded conditions of the SLOPolicies.
{{- end -}}
