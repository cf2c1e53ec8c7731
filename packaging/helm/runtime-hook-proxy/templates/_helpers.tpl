{{/* Names, labels and shared pieces of the chart's objects. */}}

{{- define "rhp.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels every object carries; "component" is the part (node, scheduler, manager, crds). */}}
{{- define "rhp.labels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: runtime-hook-proxy
app.kubernetes.io/component: {{ .component }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The selector labels of one part's pods. */}}
{{- define "rhp.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* An image reference: registry/repository:tag, or the repository as it is without a registry. */}}
{{- define "rhp.image" -}}
{{- $registry := .root.Values.image.registry -}}
{{- if $registry -}}
{{- printf "%s/%s:%s" (trimSuffix "/" $registry) .image.repository .image.tag -}}
{{- else -}}
{{- printf "%s:%s" .image.repository .image.tag -}}
{{- end -}}
{{- end -}}

{{/* The API server's address for in-cluster clients, when apiServer.host/port are set. */}}
{{- define "rhp.apiServerEnv" -}}
{{- if .Values.apiServer.host }}
- name: KUBERNETES_SERVICE_HOST
  value: {{ .Values.apiServer.host | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ .Values.apiServer.port | toString | quote }}
{{- end }}
{{- end -}}

{{/* Pod-level settings every part shares. */}}
{{- define "rhp.podNetwork" -}}
{{- if .Values.hostNetwork }}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The node agent's config file. */}}
{{- define "rhp.nodeConfig" -}}
{{- $v := .Values.node -}}
{{- $plugins := list -}}
{{- range $v.plugins }}{{ $plugins = append $plugins . }}{{ end -}}
{{- if $v.eviction.enabled -}}
{{- $plugins = append $plugins (dict "name" "memory_evict") -}}
{{- $plugins = append $plugins (dict "name" "cpu_evict") -}}
{{- end -}}
{{- $config := dict "plugins" $plugins "defaultPolicy" $v.defaultPolicy "defaultTimeout" $v.defaultTimeout
      "hookServerTimeout" $v.hookServerTimeout "cgroupRoot" $v.cgroupRoot "fromCluster" true -}}
{{- if $v.eviction.enabled -}}
{{- $_ := set $config "usageLoop" (dict "evictBy" $v.eviction.by) -}}
{{- end -}}
{{- if include "rhp.reportOn" . -}}
{{- $_ := set $config "report" (dict "enable" true "kubeletConfigFile" $v.report.kubeletConfigFile
      "kubeletCPUManagerStateFile" $v.report.kubeletCPUManagerStateFile) -}}
{{- end -}}
{{- if .Values.scheduler.enabled -}}
{{- $_ := set $config "allocationTrust" (dict "publicKeyFiles" (list "/etc/runtime-hook-proxy-keys/public-keys")
      "acceptUnsigned" false) -}}
{{- end -}}
{{- toYaml (mergeOverwrite $config (deepCopy $v.extraConfig)) -}}
{{- end -}}

{{/* What runs, after koordinator.present: each is "true" or empty. With Koordinator in the
cluster, the manager, its webhook, the node reports and the PriorityClasses are Koordinator's. */}}
{{- define "rhp.managerOn" -}}
{{- if and .Values.manager.enabled (not .Values.koordinator.present) }}true{{ end -}}
{{- end -}}
{{- define "rhp.webhookOn" -}}
{{- if and (include "rhp.managerOn" .) .Values.webhook.enabled }}true{{ end -}}
{{- end -}}
{{- define "rhp.reportOn" -}}
{{- if and .Values.node.enabled .Values.node.report.enabled (not .Values.koordinator.present) }}true{{ end -}}
{{- end -}}
{{- define "rhp.priorityClassesOn" -}}
{{- if and .Values.priorityClasses.install (not .Values.koordinator.present) }}true{{ end -}}
{{- end -}}
{{/* The webhook's certificate comes from cert-manager (else the manager issues it). */}}
{{- define "rhp.webhookCertManager" -}}
{{- $source := .Values.webhook.certificate.source -}}
{{- if or (eq $source "cert-manager") (and (eq $source "auto") (.Capabilities.APIVersions.Has "cert-manager.io/v1")) }}true{{ end -}}
{{- end -}}
{{/* The host the API server dials for the webhook: the url's, else the Service's DNS name. */}}
{{- define "rhp.webhookHost" -}}
{{- if .Values.webhook.url -}}
{{- (urlParse .Values.webhook.url).host | splitList ":" | first -}}
{{- else -}}
{{- printf "%s-webhook.%s.svc" (include "rhp.fullname" .) .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the extenders' signing key (templates/scheduler-signing-keys.yaml). */}}
{{- define "rhp.signingKeySecret" -}}
{{- .Values.scheduler.signingKey.secretName | default (printf "%s-signing-key" (include "rhp.fullname" .)) -}}
{{- end -}}

{{/* The ConfigMap of the public keys the node agents verify allocations with. */}}
{{- define "rhp.publicKeysConfigMap" -}}
{{- .Values.scheduler.signingKey.publicKeysConfigMap | default (printf "%s-public-keys" (include "rhp.fullname" .)) -}}
{{- end -}}

{{/* kube-scheduler's image tag: scheduler.kubeScheduler.image.tag when set; else the cluster's own
     release (the API server's version helm reads at install and upgrade, or --kube-version,
     without a provider's suffix such as "-eks-..." or "+k3s1": registry.k8s.io tags only the
     release), so the scheduler is never newer or older than its control plane; a version below
     the supported 1.34 (helm template without --kube-version reports helm's own default, v1.20.0
     for a helm built from source) takes the newest release the chart is tested with. */}}
{{- define "rhp.kubeSchedulerTag" -}}
{{- $tag := .Values.scheduler.kubeScheduler.image.tag -}}
{{- if $tag -}}
{{- $tag -}}
{{- else -}}
{{- $release := regexFind "^v?[0-9]+[.][0-9]+[.][0-9]+" .Capabilities.KubeVersion.Version | trimPrefix "v" -}}
{{- if and $release (semverCompare ">=1.34.0" $release) -}}
{{- printf "v%s" $release -}}
{{- else -}}
v1.37.2
{{- end -}}
{{- end -}}
{{- end -}}
