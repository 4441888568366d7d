{{/*
Prefix of every object name: fullnameOverride, else the release name (so the hub Service is
`<release>-hub`). Release names are at most 53 characters, so suffixes fit in 63.
*/}}
{{- define "nextmini.fullname" -}}
{{- default .Release.Name .Values.fullnameOverride | trunc 53 | trimSuffix "-" -}}
{{- end -}}

{{/* Name of an object: "<fullname>-<suffix>", cut to 63 characters. Call with (list $ "suffix"). */}}
{{- define "nextmini.objname" -}}
{{- $root := index . 0 -}}
{{- printf "%s-%s" (include "nextmini.fullname" $root) (index . 1) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "nextmini.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "nextmini.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "nextmini.labels" -}}
helm.sh/chart: {{ include "nextmini.chart" . }}
app.kubernetes.io/name: {{ include "nextmini.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: nextmini
{{- end -}}

{{/* Selector labels of a component. Call with (list $ "component"). */}}
{{- define "nextmini.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "nextmini.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* Labels of a component's objects. Call with (list $ "component"). */}}
{{- define "nextmini.componentLabels" -}}
{{ include "nextmini.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "nextmini.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "nextmini.objname" (list . "operator")) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "nextmini.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "nextmini.agentImage" -}}
{{- $repo := default .Values.image.repository .Values.agent.image.repository -}}
{{- $tag := default (default .Chart.AppVersion .Values.image.tag) .Values.agent.image.tag -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}

{{- define "nextmini.agentPullPolicy" -}}
{{- default .Values.image.pullPolicy .Values.agent.image.pullPolicy -}}
{{- end -}}

{{- define "nextmini.hubAddress" -}}
{{- printf "https://%s.%s.svc:%d" (include "nextmini.objname" (list . "hub")) .Release.Namespace (int .Values.hub.port) -}}
{{- end -}}

{{/* PostgreSQL in the release: Service, Secret and host. */}}
{{- define "nextmini.postgresql.fullname" -}}
{{- include "nextmini.objname" (list . "postgresql") -}}
{{- end -}}

{{- define "nextmini.postgresql.secretName" -}}
{{- default (include "nextmini.postgresql.fullname" .) .Values.postgresql.auth.existingSecret -}}
{{- end -}}

{{- define "nextmini.postgresql.host" -}}
{{- printf "%s.%s.svc" (include "nextmini.postgresql.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* The Secret holding externalDatabase.url when it is given by value. */}}
{{- define "nextmini.externalDatabase.secretName" -}}
{{- include "nextmini.objname" (list . "database") -}}
{{- end -}}

{{/*
Fails with a message naming the value when the database settings cannot work. Included by the
templates that depend on them.
*/}}
{{- define "nextmini.validateDatabase" -}}
{{- if not .Values.postgresql.enabled -}}
{{- if and (not .Values.externalDatabase.url) (not .Values.externalDatabase.existingSecret) -}}
{{- fail "postgresql.enabled is false, so externalDatabase.url (postgres://user:password@host:5432/db) or externalDatabase.existingSecret must be set" -}}
{{- end -}}
{{- if and .Values.externalDatabase.existingSecret (not .Values.externalDatabase.existingSecretKey) -}}
{{- fail "externalDatabase.existingSecretKey must name the key of the URL in externalDatabase.existingSecret" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The operator's DATABASE_URL (and what it needs before it: Kubernetes expands $(VAR) only from
variables defined earlier in the list).
*/}}
{{- define "nextmini.databaseEnv" -}}
{{- if .Values.postgresql.enabled }}
- name: NEXTMINI_DATABASE_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "nextmini.postgresql.secretName" . }}
      key: {{ .Values.postgresql.auth.secretKey }}
- name: DATABASE_URL
  value: {{ printf "postgres://%s:$(NEXTMINI_DATABASE_PASSWORD)@%s:%d/%s" .Values.postgresql.auth.username (include "nextmini.postgresql.host" .) (int .Values.postgresql.port) .Values.postgresql.auth.database | quote }}
{{- else if .Values.externalDatabase.existingSecret }}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.externalDatabase.existingSecret }}
      key: {{ .Values.externalDatabase.existingSecretKey }}
{{- else }}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "nextmini.externalDatabase.secretName" . }}
      key: url
{{- end }}
{{- end -}}

{{/*
Fails the install when PostgreSQL's volume would wait forever: persistence on, no
storageClass given, and a cluster without a default StorageClass. Only against a
cluster: `helm template` and --dry-run=client look nothing up and pass.
*/}}
{{- define "nextmini.postgresql.requireStorageClass" -}}
{{- $pg := .Values.postgresql -}}
{{- if and $pg.persistence.enabled (not $pg.persistence.storageClass) -}}
{{- $system := lookup "v1" "Namespace" "" "kube-system" -}}
{{- if $system -}}
{{- $default := false -}}
{{- range (lookup "storage.k8s.io/v1" "StorageClass" "" "").items -}}
{{- $annotations := .metadata.annotations | default dict -}}
{{- if or (eq (get $annotations "storageclass.kubernetes.io/is-default-class") "true") (eq (get $annotations "storageclass.beta.kubernetes.io/is-default-class") "true") -}}
{{- $default = true -}}
{{- end -}}
{{- end -}}
{{- if not $default -}}
{{- fail "postgresql.persistence: this cluster has no default StorageClass, so PostgreSQL's volume would stay Pending. Set postgresql.persistence.storageClass to one of `kubectl get storageclass`, or postgresql.persistence.enabled=false (the data then lives as long as the pod)" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
