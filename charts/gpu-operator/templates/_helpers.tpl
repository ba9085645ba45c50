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
A values map without its empty strings, lists and maps (booleans and numbers stay). The ClusterPolicy is
applied server-side by Helm 4: every field the chart writes is owned by Helm, and a field a user later sets
with `kubectl patch` (as NVIDIA's guides do) would conflict at the next `helm upgrade`. So the chart writes
only fields that say something.
*/}}
{{- define "gpu-operator.compact" -}}
{{- $out := dict -}}
{{- range $key, $value := . -}}
{{- if or (kindIs "bool" $value) (kindIs "float64" $value) (kindIs "int" $value) (kindIs "int64" $value) (not (empty $value)) -}}
{{- $_ := set $out $key $value -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/*
The ClusterPolicy spec of one operand section: the section's values minus the chart-only keys and empty
values, with this project's images defaulting to the chart's appVersion.
*/}}
{{- define "gpu-operator.operandSection" -}}
{{- $section := omit .section "create" "data" -}}
{{- if and $section.repository (eq (toString $section.version) "") -}}
{{- $_ := set $section "version" .root.Chart.AppVersion -}}
{{- end -}}
{{- include "gpu-operator.compact" $section -}}
{{- end -}}
