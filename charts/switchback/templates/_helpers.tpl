{{/* Common labels. */}}
{{- define "switchback.labels" -}}
app.kubernetes.io/part-of: switchback
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{/* The labels that select a component's pods: (dict "root" . "component" "proxy"). */}}
{{- define "switchback.selectorLabels" -}}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Image reference: (dict "root" . "image" .Values.proxy.image). */}}
{{- define "switchback.image" -}}
{{ .image.repository }}:{{ .image.tag | default .root.Chart.AppVersion }}
{{- end }}

{{/*
topologySpreadConstraints of a component, each with the component's labelSelector
unless it names its own: (dict "root" . "component" "proxy" "constraints" list).
*/}}
{{- define "switchback.topologySpread" -}}
{{- $selector := dict "matchLabels" (include "switchback.selectorLabels" . | fromYaml) }}
{{- $out := list }}
{{- range .constraints }}
{{- $c := deepCopy . }}
{{- if not (hasKey $c "labelSelector") }}
{{- $_ := set $c "labelSelector" $selector }}
{{- end }}
{{- $out = append $out $c }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{- define "switchback.operator" -}}{{ .Release.Name }}-operator{{- end }}
{{- define "switchback.proxy" -}}{{ .Release.Name }}-proxy{{- end }}

{{- /* The client key HMAC Secret's name, and the auth flags, volume and mount the
       operator and the proxies share. */}}
{{- define "switchback.hmacSecret" -}}
{{- .Values.auth.existingSecret | default (printf "%s-client-key-hmac" .Release.Name) -}}
{{- end }}
{{- define "switchback.authArgs" -}}
- --auth={{ .Values.auth.mode }}
{{- if eq .Values.auth.mode "required" }}
- --client-key-hmac-file=/etc/switchback/client-key-hmac/{{ .Values.auth.secretKey }}
{{- end }}
{{- end }}
{{- define "switchback.authMount" -}}
{{- if or (eq .Values.auth.mode "required") .Values.admin.tokenAuth }}
volumeMounts:
  {{- if eq .Values.auth.mode "required" }}
  - { name: client-key-hmac, mountPath: /etc/switchback/client-key-hmac, readOnly: true }
  {{- end }}
  {{- if .Values.admin.tokenAuth }}
  - { name: admin-token, mountPath: /etc/switchback/admin-token, readOnly: true }
  {{- end }}
{{- end }}
{{- end }}
{{- define "switchback.authVolume" -}}
{{- if or (eq .Values.auth.mode "required") .Values.admin.tokenAuth }}
volumes:
  {{- if eq .Values.auth.mode "required" }}
  - name: client-key-hmac
    secret:
      secretName: {{ include "switchback.hmacSecret" . }}
      items: [ { key: {{ .Values.auth.secretKey }}, path: {{ .Values.auth.secretKey }} } ]
  {{- end }}
  {{- if .Values.admin.tokenAuth }}
  # A volume, not an env var or subPath mount: a rotated Secret reaches the running
  # pods, and proxy and operator re-read the file when it changes.
  - name: admin-token
    secret:
      secretName: {{ include "switchback.adminTokenSecret" . }}
      items: [ { key: {{ .Values.admin.secretKey }}, path: {{ .Values.admin.secretKey }} } ]
  {{- end }}
{{- end }}
{{- end }}

{{- /* The admin token Secret's name and the file the proxy and the operator read. */}}
{{- define "switchback.adminTokenSecret" -}}
{{- .Values.admin.existingSecret | default (printf "%s-admin-token" .Release.Name) -}}
{{- end }}
{{- define "switchback.adminTokenFile" -}}
/etc/switchback/admin-token/{{ .Values.admin.secretKey }}
{{- end }}
