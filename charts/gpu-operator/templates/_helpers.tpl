{{/* Common labels of every object the chart creates. */}}
{{- define "gpu-operator.labels" -}}
app.kubernetes.io/name: gpu-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Image version of one of this project's images: the section's version, else the chart's appVersion. */}}
{{- define "gpu-operator.version" -}}
{{- .section.version | default .root.Chart.AppVersion -}}
{{- end -}}

{{/*
The ClusterPolicy spec of one operand section: the section's values minus the chart-only keys, with this
project's images defaulting to the chart's appVersion.
*/}}
{{- define "gpu-operator.operandSection" -}}
{{- $section := omit .section "create" "data" -}}
{{- if and $section.repository (eq (toString $section.version) "") -}}
{{- $_ := set $section "version" .root.Chart.AppVersion -}}
{{- end -}}
{{- toYaml $section -}}
{{- end -}}
