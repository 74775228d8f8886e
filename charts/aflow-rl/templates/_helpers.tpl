{{/* Name of the chart, overridable. */}}
{{- define "aflow-rl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's objects (at most 50 characters, so suffixes fit in 63). */}}
{{- define "aflow-rl.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "aflow-rl.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels selecting the operator's pods. */}}
{{- define "aflow-rl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "aflow-rl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels of every object of the release. */}}
{{- define "aflow-rl.labels" -}}
helm.sh/chart: {{ include "aflow-rl.chart" . }}
{{ include "aflow-rl.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: aflow-rl
{{- end }}

{{- define "aflow-rl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "aflow-rl.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Whether replicas coordinate through kopf's peering (more than one replica, or asked). */}}
{{- define "aflow-rl.peering" -}}
{{- if or .Values.peering.enabled (gt (int .Values.replicaCount) 1) }}true{{ end }}
{{- end }}

{{- define "aflow-rl.peeringName" -}}
{{- default (include "aflow-rl.fullname" .) .Values.peering.name }}
{{- end }}

{{/* Rules on the objects of the namespaces the operator watches (see rbac.yaml). Children are
written with server-side apply (patch, which also creates) and watched (list, watch). */}}
{{- define "aflow-rl.namespacedRules" -}}
- apiGroups: ["aflowrl.io"]
  resources: ["trainingruns"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["aflowrl.io"]
  resources: ["trainingruns/status"]
  verbs: ["get", "patch"]
# Children set blockOwnerDeletion on their owner reference to the run: clusters that enforce
# owner-reference permissions (the OwnerReferencesPermissionEnforcement admission plugin)
# require update on the owner's finalizers subresource for that.
- apiGroups: ["aflowrl.io"]
  resources: ["trainingruns/finalizers"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["configmaps", "services"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["serviceaccounts", "persistentvolumeclaims"]
  verbs: ["get", "create", "patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: ["apps"]
  resources: ["deployments", "statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Deleted when spec.networkPolicy is turned off.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["monitoring.coreos.com"]
  resources: ["podmonitors"]
  verbs: ["get", "create", "patch", "delete"]
# One LeaderWorkerSet per multi-node replica: a smaller count deletes the run's own ones beyond
# it, found by label (list); their status changes (ready groups) are watched.
- apiGroups: ["leaderworkerset.x-k8s.io"]
  resources: ["leaderworkersets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
{{- if .Values.rbac.gangScheduling }}
- apiGroups: ["scheduling.x-k8s.io"]
  resources: ["podgroups"]
  verbs: ["get", "create", "patch", "delete"]
{{- end }}
{{- if .Values.rbac.kueue }}
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# PodsReady, the quota given back after an eviction, Finished (as Kueue's job controllers).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["get", "patch"]
# Whether the LocalQueue a run names (or the namespace's "default") exists.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["localqueues"]
  verbs: ["get"]
{{- end }}
{{- if include "aflow-rl.peering" . }}
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end }}

{{/* The pod spec of a hook (CRD upgrade, helm test): the operator image running one task.
Arguments: root (the chart's context), serviceAccount, args. */}}
{{- define "aflow-rl.hookPod" -}}
{{- $root := .root -}}
serviceAccountName: {{ .serviceAccount }}
automountServiceAccountToken: true
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ if kindIs "string" . }}{{ . }}{{ else }}{{ .name }}{{ end }}
  {{- end }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  seccompProfile:
    type: RuntimeDefault
containers:
  - name: task
    image: "{{ $root.Values.image.repository }}:{{ $root.Values.image.tag | default $root.Chart.AppVersion }}"
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    command: ["aflowrl-operator"]
    args:
      {{- toYaml .args | nindent 6 }}
    env:
      - name: HOME
        value: /tmp
    resources:
      requests: {cpu: 50m, memory: 128Mi}
      limits: {memory: 256Mi}
    securityContext:
      runAsNonRoot: true
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities:
        drop: ["ALL"]
{{- end }}

{{/* The CEL of the Kueue suspend policy (kueue-suspend-policy.yaml). */}}
{{- define "aflow-rl.kueueQueuedCondition" -}}
has(object.metadata.labels) && 'kueue.x-k8s.io/queue-name' in object.metadata.labels && object.metadata.labels['kueue.x-k8s.io/queue-name'] != ''
{{- end }}
{{- define "aflow-rl.kueueNotSuspendedCondition" -}}
!has(object.spec) || !has(object.spec.suspend) || !object.spec.suspend
{{- end }}
{{- define "aflow-rl.kueueSuspendMutation" -}}
Object{metadata: Object.metadata{annotations: {'aflowrl.io/suspended-by': 'kueue'}}, spec: Object.spec{suspend: true}}
{{- end }}
{{- define "aflow-rl.kueueQueueNameUnchanged" -}}
(has(object.spec) && has(object.spec.suspend) && object.spec.suspend) || ((has(object.metadata.labels) && 'kueue.x-k8s.io/queue-name' in object.metadata.labels) ? object.metadata.labels['kueue.x-k8s.io/queue-name'] : '') == ((has(oldObject.metadata.labels) && 'kueue.x-k8s.io/queue-name' in oldObject.metadata.labels) ? oldObject.metadata.labels['kueue.x-k8s.io/queue-name'] : '')
{{- end }}
{{- define "aflow-rl.kueueQueueNameMessage" -}}
'the kueue.x-k8s.io/queue-name label of a TrainingRun that is not suspended is immutable (as Kueue keeps its own jobs\' queue names): suspend the run to change its queue'
{{- end }}
