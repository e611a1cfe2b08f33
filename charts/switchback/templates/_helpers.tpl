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
{{- /* The Role whose rules the operator keeps to `get` on exactly the rendered objects
       the index names (--proxy-reader-role), bound to the proxies. */}}
{{- define "switchback.proxyReader" -}}{{ .Release.Name }}-proxy-reader{{- end }}

{{- /* The client key HMAC Secret's name: the user's (auth.existingSecret) or the one
       the operator generates (--generate-client-key-hmac). */}}
{{- define "switchback.hmacSecret" -}}
{{- .Values.auth.existingSecret | default (printf "%s-client-key-hmac" .Release.Name) -}}
{{- end }}

{{- /* The admin token Secret's name: the user's (admin.existingSecret) or the one the
       operator generates (--generate-admin-token). */}}
{{- define "switchback.adminTokenSecret" -}}
{{- .Values.admin.existingSecret | default (printf "%s-admin-token" .Release.Name) -}}
{{- end }}

{{- /* The operator's Secret flags. It reads both Secrets through the API (it mounts
       neither: a pod waits for its required Secret volumes, and the operator is the one
       that creates the generated Secrets), and creates a missing generated Secret with
       a random value at start, never overwriting one. */}}
{{- define "switchback.operatorSecretArgs" -}}
- --auth={{ .Values.auth.mode }}
{{- if eq .Values.auth.mode "required" }}
- --client-key-hmac-secret={{ include "switchback.hmacSecret" . }}
- --client-key-hmac-secret-key={{ .Values.auth.secretKey }}
{{- if not .Values.auth.existingSecret }}
- --generate-client-key-hmac
{{- end }}
{{- end }}
{{- if .Values.admin.tokenAuth }}
- --admin-token-secret={{ include "switchback.adminTokenSecret" . }}
- --admin-token-secret-key={{ .Values.admin.secretKey }}
{{- if not .Values.admin.existingSecret }}
- --generate-admin-token
{{- end }}
{{- end }}
{{- end }}

{{- /* The proxy's auth flags, and the Secret volumes and mounts behind them. The
       volumes are required (not optional): the kubelet holds a proxy pod until the
       operator has created the generated Secrets. */}}
{{- define "switchback.proxyAuthArgs" -}}
- --auth={{ .Values.auth.mode }}
{{- if eq .Values.auth.mode "required" }}
- --client-key-hmac-file=/etc/switchback/client-key-hmac/{{ .Values.auth.secretKey }}
{{- end }}
{{- if .Values.admin.tokenAuth }}
- --admin-token-file=/etc/switchback/admin-token/{{ .Values.admin.secretKey }}
{{- end }}
{{- end }}
{{- define "switchback.proxyAuthMounts" -}}
{{- if eq .Values.auth.mode "required" }}
- { name: client-key-hmac, mountPath: /etc/switchback/client-key-hmac, readOnly: true }
{{- end }}
{{- if .Values.admin.tokenAuth }}
- { name: admin-token, mountPath: /etc/switchback/admin-token, readOnly: true }
{{- end }}
{{- end }}
{{- define "switchback.proxyAuthVolumes" -}}
{{- if eq .Values.auth.mode "required" }}
- name: client-key-hmac
  secret:
    secretName: {{ include "switchback.hmacSecret" . }}
    items: [ { key: {{ .Values.auth.secretKey }}, path: {{ .Values.auth.secretKey }} } ]
{{- end }}
{{- if .Values.admin.tokenAuth }}
# A volume, not an env var or subPath mount: a rotated Secret reaches the running
# pods, and the proxy re-reads the file when it changes.
- name: admin-token
  secret:
    secretName: {{ include "switchback.adminTokenSecret" . }}
    items: [ { key: {{ .Values.admin.secretKey }}, path: {{ .Values.admin.secretKey }} } ]
{{- end }}
{{- end }}

{{- /*
The operator's rules in the namespaces it watches: a ClusterRole's in cluster mode
(watchNamespaces empty), a Role's in each listed namespace in namespaced mode. Exactly
the calls operator/src makes there, and nothing else.
*/}}
{{- define "switchback.operatorWatchRules" -}}
# Reflectors (list + watch) of the three kinds; the operator never GETs one by name.
- apiGroups: ["switchback.dev"]
  resources: ["llmroutes", "providercredentials", "llmclients"]
  verbs: ["list", "watch"]
# The credential finalizer: a JSON merge patch of metadata.finalizers.
- apiGroups: ["switchback.dev"]
  resources: ["providercredentials"]
  verbs: ["patch"]
# Status: server-side apply to the status subresource (a PATCH), never read back.
- apiGroups: ["switchback.dev"]
  resources: ["llmroutes/status", "providercredentials/status", "llmclients/status"]
  verbs: ["patch"]
# The Secrets credentials and clients reference: watched as metadata (list + watch;
# RBAC cannot tell a metadata watch from a full one), and the referenced ones read
# with GET. This is the grant that namespaced mode confines.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch"]
# Events on routes and credentials (circuit opened/closed, deletion held), in the
# object's namespace: kube-runtime's Recorder creates them and patches a series.
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{- /* Probe settings from values: everything but `enabled`. */}}
{{- define "switchback.probe" -}}
{{- $p := omit .probe "enabled" -}}
httpGet: { path: {{ .path }}, port: {{ .port }} }
{{- range $k := keys $p | sortAlpha }}
{{ $k }}: {{ index $p $k | int64 }}
{{- end }}
{{- end }}

{{- /* A component's pod labels: the chart's, then the user's podLabels where they do not
       clash with them (dict "root" . "component" "proxy" "extra" .Values.proxy.podLabels). */}}
{{- define "switchback.podLabels" -}}
{{- $ours := include "switchback.labels" .root | fromYaml }}
{{- $_ := set $ours "app.kubernetes.io/component" .component }}
{{- toYaml (merge $ours (deepCopy (.extra | default dict))) }}
{{- end }}

{{- /* The pod spec parts both helm test pods share: non-root, read-only, no token. */}}
{{- define "switchback.testPodSpec" -}}
restartPolicy: Never
# No API access: the tests only speak HTTP to the proxies.
automountServiceAccountToken: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  seccompProfile: { type: RuntimeDefault }
{{- end }}
{{- define "switchback.testContainer" -}}
image: {{ .Values.tests.image.repository }}:{{ .Values.tests.image.tag }}
imagePullPolicy: {{ .Values.tests.image.pullPolicy }}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities: { drop: ["ALL"] }
resources:
  requests: { cpu: 10m, memory: 16Mi }
  limits: { memory: 64Mi }
{{- end }}
