{{/*
Common labels of every object the chart creates, Helm's standard ones. The component is that of the template file
the object comes from (one part of the stack per file), so that every template includes the labels the same way.
*/}}
{{- define "gpu-operator.labels" -}}
{{- $components := dict
      "clusterpolicy.yaml" "cluster-policy"
      "nvidiadriver.yaml" "nvidia-driver"
      "configmaps.yaml" "config"
      "dashboard.yaml" "dashboard"
      "deployment.yaml" "operator"
      "device-plugin-rbac.yaml" "device-plugin"
      "deviceclasses.yaml" "dra"
      "monitoring.yaml" "monitoring"
      "network-policy.yaml" "operator"
      "node-agent-rbac.yaml" "node-agent"
      "node-bound-writes.yaml" "node-agent"
      "node-facts.yaml" "node-facts"
      "operand-serviceaccounts.yaml" "operands"
      "rbac.yaml" "operator"
      "serviceaccount.yaml" "operator"
      "uninstall-hook.yaml" "uninstall" }}
app.kubernetes.io/name: gpu-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- $component := get $components (base .Template.Name) }}
{{- if not $component }}
{{- fail (printf "templates/_helpers.tpl: %s has no component in gpu-operator.labels; add it there" (base .Template.Name)) }}
{{- end }}
app.kubernetes.io/component: {{ $component }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/*
The repository of this project's own images: operator.repository, unless it names NVIDIA's registry (as NVIDIA's
values file does), whose operator image does not run this chart's operator; then this project's home repository,
the one the operator has compiled in. global.imageRegistry, when set, takes the place of its registry.
*/}}
{{- define "gpu-operator.ownRepository" -}}
{{- $repository := .Values.operator.repository | default "ghcr.io/gpu-operator-rs" -}}
{{- if hasPrefix "nvcr.io/" $repository -}}
{{- $repository = "ghcr.io/gpu-operator-rs" -}}
{{- end -}}
{{- include "gpu-operator.onImageRegistry" (dict "repository" $repository "root" .) -}}
{{- end -}}

{{/*
A repository of this project's images on global.imageRegistry (HAMi's and Bitnami's one knob for a private or
mirrored registry): its registry, the first path element when that names a host (has a dot or a port, or is
localhost), is replaced and the path kept, so `ghcr.io/gpu-operator-rs` becomes
`<global.imageRegistry>/gpu-operator-rs`, where `cargo xtask images --push <registry>/gpu-operator-rs` puts the
images. Without global.imageRegistry the repository is returned as it is.
*/}}
{{- define "gpu-operator.onImageRegistry" -}}
{{- $registry := trimSuffix "/" ((.root.Values.global | default dict).imageRegistry | default "") -}}
{{- if $registry -}}
{{- $parts := splitList "/" .repository -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq "localhost" $first)) -}}
{{- $parts = rest $parts -}}
{{- end -}}
{{- printf "%s/%s" $registry (join "/" $parts) -}}
{{- else -}}
{{- .repository -}}
{{- end -}}
{{- end -}}

{{/*
The image pull secrets of the operator's own pods (its Deployment, the uninstall hook, node-facts):
operator.imagePullSecrets and global.imagePullSecrets, as a pod spec's `imagePullSecrets` (empty when none).
*/}}
{{- define "gpu-operator.imagePullSecrets" -}}
{{- $secrets := concat (.Values.operator.imagePullSecrets | default list) ((.Values.global | default dict).imagePullSecrets | default list) | uniq -}}
{{- with $secrets -}}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* The version of this project's own images: operator.version, else the chart's appVersion. */}}
{{- define "gpu-operator.ownVersion" -}}
{{- .Values.operator.version | default .Chart.AppVersion -}}
{{- end -}}

{{/* One of this project's images by name, e.g. gpu-node-agent. */}}
{{- define "gpu-operator.ownImage" -}}
{{- printf "%s/%s:%s" (include "gpu-operator.ownRepository" .root) .name (include "gpu-operator.ownVersion" .root) -}}
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
The ClusterPolicy spec of one operand section: the keys of the section that the ClusterPolicy defines (the
common ones and `.keys`), without empty values, and with the chart's appVersion where a repository is set but no
version (NVIDIA's chart does the same for the validator and node status exporter). Other keys of the section
(NVIDIA's `hostNetwork`, chart-only keys such as `create` and `data`) are left out. A section that runs one of this
project's images has its repository on global.imageRegistry; every section gets global.imagePullSecrets.
*/}}
{{- define "gpu-operator.operandSection" -}}
{{- $common := list "enabled" "repository" "image" "version" "imagePullPolicy" "imagePullSecrets" "resources" "args" "env" -}}
{{- $section := dict -}}
{{- range $key := concat $common (.keys | default list) -}}
{{- if hasKey $.section $key -}}
{{- $_ := set $section $key (index $.section $key) -}}
{{- end -}}
{{- end -}}
{{- if and $section.repository (eq (toString ($section.version | default "")) "") -}}
{{- $_ := set $section "version" .root.Chart.AppVersion -}}
{{- end -}}
{{- /* NVIDIA's values name NVIDIA's gpu-operator image (nvcr.io) for the validator and node status exporter: not
       ours; the operator runs its own default image, already on the registry, in its place. */ -}}
{{- if and $section.repository (has $section.image (list "gpu-operator" "gpu-node-agent" "gpu-device-plugin" "gpu-dra-driver")) (not (hasPrefix "nvcr.io/" $section.repository)) -}}
{{- $_ := set $section "repository" (include "gpu-operator.onImageRegistry" (dict "repository" $section.repository "root" .root)) -}}
{{- end -}}
{{- with (.root.Values.global | default dict).imagePullSecrets -}}
{{- $_ := set $section "imagePullSecrets" (concat ($section.imagePullSecrets | default list) . | uniq) -}}
{{- end -}}
{{- include "gpu-operator.compact" $section -}}
{{- end -}}

{{/* The operator image's pod security context: it runs as a non-root user, with the runtime's seccomp profile. */}}
{{- define "gpu-operator.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The operator image's container security context: no privilege, no capability, a read-only root. */}}
{{- define "gpu-operator.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}
