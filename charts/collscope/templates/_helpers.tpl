{{/* Names and labels shared by every template. */}}

{{- define "collscope.fullname" -}}
{{- if contains "collscope" .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-collscope" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "collscope.labels" -}}
app.kubernetes.io/name: collscope
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "collscope.operator.selector" -}}
app.kubernetes.io/name: collscope
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "collscope.agent.selector" -}}
app.kubernetes.io/name: collscope
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end -}}

{{- define "collscope.operator.name" -}}{{ include "collscope.fullname" . }}-operator{{- end -}}
{{- define "collscope.agent.name" -}}{{ include "collscope.fullname" . }}-agent{{- end -}}
{{- define "collscope.webhook.name" -}}{{ include "collscope.fullname" . }}-webhook{{- end -}}

{{- define "collscope.tag" -}}{{ .Values.image.tag | default .Chart.AppVersion }}{{- end -}}

{{/* An image reference: registry/repository@digest when a digest is set (immutable: what was
tested is what runs), else registry/repository:tag. Called with (list $ .Values.X.image). */}}
{{- define "collscope.image" -}}
{{- $root := index . 0 -}}
{{- $image := index . 1 -}}
{{- $repo := printf "%s/%s" $root.Values.image.registry $image.repository -}}
{{- if $image.digest -}}
{{ $repo }}@{{ $image.digest }}
{{- else -}}
{{ $repo }}:{{ include "collscope.tag" $root }}
{{- end -}}
{{- end -}}

{{- define "collscope.operator.image" -}}
{{ include "collscope.image" (list . .Values.operator.image) }}
{{- end -}}

{{/* The agent image; also the plugin image of the webhook's init container unless
webhook.pluginImage names another. */}}
{{- define "collscope.agent.image" -}}
{{ include "collscope.image" (list . .Values.agent.image) }}
{{- end -}}

{{/* cert-manager when asked, or when "auto" and the cluster serves its API. */}}
{{- define "collscope.webhook.certManager" -}}
{{- if or (eq .Values.webhook.tls "certManager") (and (eq .Values.webhook.tls "auto") (.Capabilities.APIVersions.Has "cert-manager.io/v1")) -}}
true
{{- end -}}
{{- end -}}

{{/* The agents' certificate from cert-manager: as for the webhook, by agent.tls. */}}
{{- define "collscope.agent.certManager" -}}
{{- if or (eq .Values.agent.tls "certManager") (and (eq .Values.agent.tls "auto") (.Capabilities.APIVersions.Has "cert-manager.io/v1")) -}}
true
{{- end -}}
{{- end -}}

{{/* How the operator reaches a node's agent: operator.agentURL, else the node's IP and
agent.port ({port}), over https unless agent.tls is disabled. */}}
{{- define "collscope.agent.url" -}}
{{- .Values.operator.agentURL | default (printf "%s://{node_ip}:{port}" (ternary "http" "https" (eq .Values.agent.tls "disabled"))) -}}
{{- end -}}

{{/* The name the agents' certificate carries (one for every node: agents are reached by IP). */}}
{{- define "collscope.agent.serverName" -}}
{{ include "collscope.agent.name" . }}.{{ .Release.Namespace }}.svc
{{- end -}}
