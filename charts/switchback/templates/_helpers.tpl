{{/* Common labels. */}}
{{- define "switchback.labels" -}}
app.kubernetes.io/part-of: switchback
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end }}

{{/* Image reference for a component. */}}
{{- define "switchback.image" -}}
{{ .root.Values.image.repository }}/switchback-{{ .component }}:{{ .root.Values.image.tag | default .root.Chart.AppVersion }}
{{- end }}

{{- define "switchback.operator" -}}{{ .Release.Name }}-operator{{- end }}
{{- define "switchback.proxy" -}}{{ .Release.Name }}-proxy{{- end }}
