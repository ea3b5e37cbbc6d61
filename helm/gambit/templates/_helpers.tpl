{{- define "gambit.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gambit.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains (include "gambit.name" .) .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "gambit.name" .) | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gambit.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gambit.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gambit.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "gambit.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "gambit.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The Secret holding the Redis URL (key redis-url), and whether the chart creates it. */}}
{{- define "gambit.redisSecretName" -}}
{{- if and (eq .Values.redis.mode "external") .Values.redis.external.existingSecret -}}
{{- .Values.redis.external.existingSecret -}}
{{- else if and (eq .Values.redis.mode "internal") .Values.redis.auth.existingSecret -}}
{{- .Values.redis.auth.existingSecret -}}
{{- else -}}
{{- printf "%s-redis" (include "gambit.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "gambit.redisSecretKey" -}}
{{- if and (eq .Values.redis.mode "external") .Values.redis.external.existingSecret -}}
{{- .Values.redis.external.existingSecretKey -}}
{{- else -}}
redis-url
{{- end -}}
{{- end -}}

{{- define "gambit.redisHost" -}}
{{- printf "%s-redis.%s.svc" (include "gambit.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* Target replicas: explicit, or one per GPU of the GPU worker group. */}}
{{- define "gambit.targetReplicas" -}}
{{- $t := .Values.serve.deployments.Target -}}
{{- if kindIs "invalid" $t.numReplicas -}}
{{- $per := max 1 (int (ceil $t.numGpus)) -}}
{{- max 1 (div (mul (int .Values.gpuWorkers.replicas) (int .Values.gpuWorkers.gpusPerWorker)) $per) -}}
{{- else -}}
{{- $t.numReplicas -}}
{{- end -}}
{{- end -}}

{{/* serveConfigV2: the Serve deploy config (same shape as deploy/serve-kubernetes.yaml). */}}
{{- define "gambit.serveConfig" -}}
{{- $deps := list -}}
{{- range $name, $d := .Values.serve.deployments -}}
{{- $opts := dict "num_cpus" $d.numCpus "num_gpus" $d.numGpus -}}
{{- if $d.resources -}}{{- $_ := set $opts "resources" $d.resources -}}{{- end -}}
{{- $n := $d.numReplicas -}}
{{- if eq $name "Target" -}}{{- $n = include "gambit.targetReplicas" $ | int -}}{{- end -}}
{{- $deps = append $deps (dict "name" $name "num_replicas" $n "max_ongoing_requests" $d.maxOngoingRequests "ray_actor_options" $opts) -}}
{{- end -}}
{{- $app := dict "name" .Values.serve.application.name "route_prefix" .Values.serve.application.routePrefix "import_path" .Values.serve.application.importPath "deployments" $deps -}}
{{- if .Values.serve.application.args -}}{{- $_ := set $app "args" .Values.serve.application.args -}}{{- end -}}
{{- $cfg := dict "proxy_location" "EveryNode" "http_options" (dict "host" "0.0.0.0" "port" .Values.serve.httpPort) "grpc_options" (dict "port" .Values.serve.grpcPort "grpc_servicer_functions" .Values.serve.grpcServicerFunctions) "applications" (list $app) -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* Env shared by every Ray container. */}}
{{- define "gambit.env" -}}
- name: GAMBIT_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "gambit.redisSecretName" . }}
      key: {{ include "gambit.redisSecretKey" . }}
{{- end -}}

{{- define "gambit.rayPorts" -}}
- containerPort: {{ .Values.serve.grpcPort }}
  name: serve-grpc
- containerPort: {{ .Values.serve.httpPort }}
  name: serve
- containerPort: {{ .Values.monitoring.metricsPort }}
  name: metrics
{{- end -}}
