{{- define "inferplane.name" -}}{{ .Release.Name }}-inferplane{{- end -}}

{{- define "inferplane.labels" -}}
app.kubernetes.io/name: inferplane
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{- define "inferplane.checks" -}}
{{- if and (eq .Values.profile "local") (gt (int .Values.gateway.replicas) 1) -}}
{{- fail "gateway.replicas > 1 requires profile: shared (the local profile is exact only for a single replica)" -}}
{{- end -}}
{{- if and (eq .Values.profile "lease") (gt (int ((.Values.gateway.config.server | default dict).workers | default 1)) 1) -}}
{{- fail "gateway.config.server.workers > 1 requires profile: local or shared (the lease profile runs one process per node: its leases are the node's share of a budget)" -}}
{{- end -}}
{{- if hasKey (.Values.gateway.config.server | default dict) "shutdown_grace_s" -}}
{{- fail "gateway.config.server.shutdown_grace_s: set gateway.shutdownGraceSeconds instead (the pods' termination grace is derived from it)" -}}
{{- end -}}
{{- end -}}

{{/* Postgres is used by the shared and lease profiles (the lease ledger lives there). */}}
{{- define "inferplane.usesDatabase" -}}
{{- if has .Values.profile (list "shared" "lease") }}true{{ end -}}
{{- end -}}

{{/* inferplaned: the policy publisher of the shared profile, the lease grantor of the
     lease profile; never in local (it would need a database nobody migrated). */}}
{{- define "inferplane.controlplane" -}}
{{- if or (eq .Values.profile "lease") (and (eq .Values.profile "shared") .Values.controlplane.enabled) }}true{{ end -}}
{{- end -}}

{{- define "inferplane.dbenv" -}}
- name: INFERPLANE_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.database.existingSecret }}
      key: {{ .Values.database.secretKey }}
{{- with .Values.database.hosts }}
{{- /* An HA cluster (docs/failover.md): libpq tries every member in order and keeps the
     one that matches PGTARGETSESSIONATTRS (read-write: the primary). */}}
- {name: PGHOST, value: {{ $hosts := list }}{{ range . }}{{ $hosts = append $hosts .host }}{{ end }}{{ join "," $hosts | quote }}}
- {name: PGPORT, value: {{ $ports := list }}{{ range . }}{{ $ports = append $ports (.port | default 5432) }}{{ end }}{{ join "," $ports | quote }}}
- {name: PGTARGETSESSIONATTRS, value: {{ $.Values.database.targetSessionAttrs | quote }}}
{{- end }}
{{- with .Values.database.tls }}
{{- if .sslmode }}
- {name: PGSSLMODE, value: {{ .sslmode | quote }}}
{{- end }}
{{- if .caSecret }}
- {name: PGSSLROOTCERT, value: "/etc/inferplane/db-ca/{{ .caKey }}"}
{{- end }}
{{- end }}
{{- end -}}

{{/* The database's CA bundle (database.tls.caSecret), mounted where PGSSLROOTCERT says. */}}
{{- define "inferplane.dbmount" -}}
{{- if .Values.database.tls.caSecret }}
- {name: db-ca, mountPath: /etc/inferplane/db-ca, readOnly: true}
{{- end }}
{{- end -}}

{{- define "inferplane.dbvolume" -}}
{{- if .Values.database.tls.caSecret }}
- name: db-ca
  secret: {secretName: {{ .Values.database.tls.caSecret }}}
{{- end }}
{{- end -}}

{{- define "inferplane.image" -}}
image: "{{ .Values.image.repository }}:{{ .Values.image.tag }}"
imagePullPolicy: {{ .Values.image.pullPolicy }}
{{- end -}}

{{/* Pod and container security: the image's unprivileged user, read-only root. */}}
{{- define "inferplane.podSecurity" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  fsGroup: 10001
  seccompProfile: {type: RuntimeDefault}
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{ toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "inferplane.containerSecurity" -}}
securityContext:
  readOnlyRootFilesystem: true
  allowPrivilegeEscalation: false
  capabilities: {drop: [ALL]}
{{- end -}}

{{/* The mayu config the gateways read: the user's config plus what the profile and
     chart values decide. */}}
{{- define "inferplane.gatewayConfig" -}}
{{- $v := .Values -}}
{{- $config := deepCopy ($v.gateway.config | default dict) -}}
{{- $server := deepCopy ($config.server | default dict) -}}
{{- $_ := set $server "shutdown_grace_s" $v.gateway.shutdownGraceSeconds -}}
{{- if $v.gateway.adminToken.existingSecret -}}
{{- $_ := set $server "admin_token_ref" "env:INFERPLANE_ADMIN_TOKEN" -}}
{{- end -}}
{{- if $v.gateway.metricsToken.existingSecret -}}
{{- $_ := set $server "metrics_token_ref" "env:INFERPLANE_METRICS_TOKEN" -}}
{{- end -}}
{{- if $v.gateway.adminTokens -}}
{{- $tokens := list -}}
{{- range $i, $t := $v.gateway.adminTokens -}}
{{- $tokens = append $tokens (dict "name" $t.name "access" $t.access "token_ref" (printf "env:INFERPLANE_ADMIN_TOKEN_%d" $i)) -}}
{{- end -}}
{{- $_ := set $server "admin_tokens" $tokens -}}
{{- end -}}
{{- $_ := set $config "server" $server -}}
{{- $_ := set $config "data_dir" "/var/lib/mayu" -}}
{{- $_ := set $config "demo" false -}}
{{- if eq $v.profile "shared" -}}
{{- $_ := set $config "key_store" (dict "type" "postgres") -}}
{{- $_ := set $config "governance_store" (dict "type" "postgres") -}}
{{- $db := deepCopy ($config.database | default dict) -}}
{{- $_ := set $db "dsn_ref" "env:INFERPLANE_DATABASE_URL" -}}
{{- $_ := set $config "database" $db -}}
{{- else if eq $v.profile "lease" -}}
{{- $url := $v.lease.controlPlaneUrl | default (printf "http://%s-inferplaned:%v" (include "inferplane.name" .) $v.controlplane.port) -}}
{{- $_ := set $config "control_plane" (dict "url" $url "token_ref" "env:INFERPLANE_CONTROL_PLANE_TOKEN" "dataplane_id" "env:INFERPLANE_NODE_NAME") -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{/* The gateway container, shared by the StatefulSet (local, shared) and the DaemonSet
     (lease). */}}
{{- define "inferplane.gatewayContainer" -}}
- name: mayu
  {{- include "inferplane.image" . | nindent 2 }}
  args: ["mayu", "serve", "--config", "/etc/mayu/mayu.yaml", "--host", "0.0.0.0",
         "--port", "{{ .Values.gateway.port }}"]
  env:
    - {name: TMPDIR, value: /tmp}
    {{- if include "inferplane.usesDatabase" . }}
    {{- include "inferplane.dbenv" . | nindent 4 }}
    {{- end }}
    {{- with .Values.gateway.adminToken }}{{ if .existingSecret }}
    - name: INFERPLANE_ADMIN_TOKEN
      valueFrom: {secretKeyRef: {name: {{ .existingSecret }}, key: {{ .key }}}}
    {{- end }}{{ end }}
    {{- range $i, $t := .Values.gateway.adminTokens }}
    - name: INFERPLANE_ADMIN_TOKEN_{{ $i }}
      valueFrom: {secretKeyRef: {name: {{ $t.existingSecret }}, key: {{ $t.key }}}}
    {{- end }}
    {{- with .Values.gateway.metricsToken }}{{ if .existingSecret }}
    - name: INFERPLANE_METRICS_TOKEN
      valueFrom: {secretKeyRef: {name: {{ .existingSecret }}, key: {{ .key }}}}
    {{- end }}{{ end }}
    {{- if eq .Values.profile "lease" }}
    # This node's own data-plane token (the key named after the node): inferplaned binds
    # it to this node's name, so it cannot report for another node.
    - name: INFERPLANE_CONTROL_PLANE_TOKEN
      valueFrom: {secretKeyRef: {name: {{ .Values.lease.tokenSecret.name }}, key: {{ .leaseNode | quote }}}}
    # One plane per node: its ledger rows keep the node's name across pod restarts.
    - name: INFERPLANE_NODE_NAME
      valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
    {{- end }}
    {{- with .Values.gateway.env }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with .Values.gateway.envFrom }}
  envFrom: {{ toYaml . | nindent 4 }}
  {{- end }}
  ports: [{name: http, containerPort: {{ .Values.gateway.port }}}]
  startupProbe: {httpGet: {path: /healthz, port: http}, periodSeconds: 1, failureThreshold: 60}
  livenessProbe: {httpGet: {path: /healthz, port: http}, periodSeconds: 10, failureThreshold: 3}
  readinessProbe: {httpGet: {path: /readyz, port: http}, periodSeconds: 2, failureThreshold: 1}
  lifecycle:
    # Endpoints drop a terminating pod while it sleeps; then SIGTERM starts the drain.
    preStop: {exec: {command: ["sleep", "{{ .Values.gateway.preStopSeconds }}"]}}
  {{- include "inferplane.containerSecurity" . | nindent 2 }}
  volumeMounts:
    - {name: config, mountPath: /etc/mayu, readOnly: true}
    - {name: data, mountPath: /var/lib/mayu}
    - {name: tmp, mountPath: /tmp}
    {{- if include "inferplane.usesDatabase" . }}
    {{- include "inferplane.dbmount" . | nindent 4 }}
    {{- end }}
  resources: {{ toYaml .Values.gateway.resources | nindent 4 }}
{{- end -}}

{{- define "inferplane.gatewayPod" -}}
metadata:
  labels:
    {{- include "inferplane.labels" . | nindent 4 }}
    app: {{ include "inferplane.name" . }}-gateway
    {{- with .leaseNode }}
    inferplane.dev/node: {{ . | sha256sum | trunc 16 | quote }}
    {{- end }}
  annotations:
    checksum/config: {{ include "inferplane.gatewayConfig" . | sha256sum }}
    {{- with .Values.gateway.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  terminationGracePeriodSeconds: {{ add .Values.gateway.preStopSeconds .Values.gateway.shutdownGraceSeconds 15 }}
  {{- include "inferplane.podSecurity" . | nindent 2 }}
  {{- with .Values.gateway.nodeSelector }}
  nodeSelector: {{ toYaml . | nindent 4 }}
  {{- end }}
  {{- with .leaseNode }}
  # Pinned to its node by name (the DaemonSet controller's own field), whatever its labels.
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
          - matchFields: [{key: metadata.name, operator: In, values: [{{ . | quote }}]}]
  {{- end }}
  {{- with .Values.gateway.tolerations }}
  tolerations: {{ toYaml . | nindent 4 }}
  {{- end }}
  {{- if ne .Values.profile "lease" }}
  {{- if eq .Values.gateway.antiAffinity "hard" }}
  affinity:
    podAntiAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        - labelSelector:
            matchLabels: {app: {{ include "inferplane.name" . }}-gateway}
          topologyKey: kubernetes.io/hostname
  {{- else if eq .Values.gateway.antiAffinity "soft" }}
  affinity:
    podAntiAffinity:
      preferredDuringSchedulingIgnoredDuringExecution:
        - weight: 100
          podAffinityTerm:
            labelSelector:
              matchLabels: {app: {{ include "inferplane.name" . }}-gateway}
            topologyKey: kubernetes.io/hostname
  {{- end }}
  {{- end }}
  containers:
    {{- include "inferplane.gatewayContainer" . | nindent 4 }}
  volumes:
    - name: config
      configMap: {name: {{ include "inferplane.name" . }}-gateway}
    - name: tmp
      emptyDir: {}
    {{- if eq .Values.profile "lease" }}
    - name: data
      {{- toYaml .Values.lease.dataVolume | nindent 6 }}
    {{- end }}
    {{- if include "inferplane.usesDatabase" . }}
    {{- include "inferplane.dbvolume" . | nindent 4 }}
    {{- end }}
{{- end -}}
