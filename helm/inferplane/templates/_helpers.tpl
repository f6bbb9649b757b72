{{- define "inferplane.name" -}}{{ .Release.Name }}-inferplane{{- end -}}
{{- define "inferplane.checks" -}}
{{- if and (eq .Values.profile "local") (gt (int .Values.gateway.replicas) 1) -}}
{{- fail "gateway.replicas > 1 requires profile: shared (the local profile is exact only for a single replica)" -}}
{{- end -}}
{{- if not (has .Values.profile (list "local" "shared")) -}}
{{- fail "profile must be local or shared" -}}
{{- end -}}
{{- end -}}
{{- define "inferplane.dbenv" -}}
- name: INFERPLANE_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.database.existingSecret }}
      key: {{ .Values.database.secretKey }}
{{- end -}}
