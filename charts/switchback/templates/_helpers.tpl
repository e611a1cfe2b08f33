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
{{- if eq .Values.auth.mode "required" }}
volumeMounts:
  - { name: client-key-hmac, mountPath: /etc/switchback/client-key-hmac, readOnly: true }
{{- end }}
{{- end }}
{{- define "switchback.authVolume" -}}
{{- if eq .Values.auth.mode "required" }}
volumes:
  - name: client-key-hmac
    secret:
      secretName: {{ include "switchback.hmacSecret" . }}
      items: [ { key: {{ .Values.auth.secretKey }}, path: {{ .Values.auth.secretKey }} } ]
{{- end }}
{{- end }}
