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

{{/* The Secret holding the Redis password, and its key. */}}
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
redis-password
{{- end -}}
{{- end -}}

{{/* Run store URL without the password (the services read it from GAMBIT_REDIS_PASSWORD). */}}
{{- define "gambit.redisUrl" -}}
{{- if eq .Values.redis.mode "internal" -}}
{{- printf "redis://%s-redis.%s.svc:6379/0" (include "gambit.fullname" .) .Release.Namespace -}}
{{- else -}}
{{- required "redis.external.url is required when redis.mode is external" .Values.redis.external.url -}}
{{- end -}}
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

{{- define "gambit.deployment" -}}
{{- $d := index .root.Values.serve.deployments .name -}}
{{- $opts := dict "num_cpus" $d.numCpus "num_gpus" $d.numGpus -}}
{{- if $d.resources -}}{{- $_ := set $opts "resources" $d.resources -}}{{- end -}}
{{- $out := dict "name" .name "max_ongoing_requests" $d.maxOngoingRequests "ray_actor_options" $opts -}}
{{- $scorer := .root.Values.serve.scorer -}}
{{- if eq .name "Target" -}}
{{- $_ := set $out "num_replicas" (include "gambit.targetReplicas" .root | int) -}}
{{- else if and (eq .name "Scorer") (or (eq $scorer "sequence") (hasPrefix "random:sequence" $scorer)) -}}
{{- /* a sequence scorer keeps each trace's history in its replica: one replica, never autoscaled */ -}}
{{- $_ := set $out "num_replicas" 1 -}}
{{- else if $d.autoscaling -}}
{{- $_ := set $out "autoscaling_config" $d.autoscaling -}}
{{- else -}}
{{- $_ := set $out "num_replicas" (required (printf "serve.deployments.%s: set numReplicas or autoscaling" .name) $d.numReplicas) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* serveConfigV2: the Serve deploy config (same shape as deploy/serve-kubernetes.yaml). */}}
{{- define "gambit.serveConfig" -}}
{{- $s := .Values.serve -}}
{{- $target := include "gambit.deployment" (dict "root" . "name" "Target") | fromJson -}}
{{- $coord := include "gambit.deployment" (dict "root" . "name" "Coordinator") | fromJson -}}
{{- $scorer := include "gambit.deployment" (dict "root" . "name" "Scorer") | fromJson -}}
{{- $targetArgs := dict "model" $s.model "scorer" $s.scorer "scorer_address" (printf "127.0.0.1:%v" $s.grpcPort) "scorer_app" "scorer" "num_blocks" $s.numBlocks "cpu_weights" $s.cpuWeights "kv_dtype" $s.kvDtype "batch_invariant" $s.batchInvariant "drafters" $s.drafters -}}
{{- $gambitArgs := dict "tree" (include "gambit.redisUrl" .) "prefix" $s.redisPrefix "retention_s" $s.retentionS "token_env" $s.tokenEnv "target_replicas" $target.num_replicas "target_gpus" $s.deployments.Target.numGpus "coordinator_replicas" (default 1 $coord.num_replicas) "target" $targetArgs "defaults" $s.solveDefaults -}}
{{- $scorerArgs := dict "scorer" $s.scorer "model" $s.model "hidden_size" $s.hiddenSize "batch_wait_ms" $s.batchWaitMs "token_env" $s.tokenEnv -}}
{{- $gambitApp := dict "name" "gambit" "route_prefix" "/gambit" "import_path" "gambit.deployments.app:build_gambit" "args" $gambitArgs "deployments" (list $coord $target) -}}
{{- $scorerApp := dict "name" "scorer" "route_prefix" "/scorer" "import_path" "gambit.deployments.app:build_scorer" "args" $scorerArgs "deployments" (list $scorer) -}}
{{- $cfg := dict "proxy_location" "EveryNode" "http_options" (dict "host" "0.0.0.0" "port" $s.httpPort) "grpc_options" (dict "port" $s.grpcPort "grpc_servicer_functions" $s.grpcServicerFunctions) "applications" (list $gambitApp $scorerApp) -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* Env shared by every Ray container: the Ray/Serve settings of files/serve-env.yaml (generated from
gambit.ops.serve_env, what `gambit serve` sets; serve.extraEnv adds or overrides), then the secrets. */}}
{{- define "gambit.env" -}}
{{- $env := mergeOverwrite (.Files.Get "files/serve-env.yaml" | fromYaml) (.Values.serve.extraEnv | default dict) -}}
{{- range $k, $v := $env -}}
- name: {{ $k }}
  value: {{ $v | toString | quote }}
{{ end -}}
- name: GAMBIT_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "gambit.redisSecretName" . }}
      key: {{ include "gambit.redisSecretKey" . }}
      optional: true
{{- with .Values.serve.tokenSecret }}
- name: {{ $.Values.serve.tokenEnv }}
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: token
{{- end }}
{{- end -}}

{{- define "gambit.rayPorts" -}}
- containerPort: {{ .Values.serve.grpcPort }}
  name: serve-grpc
- containerPort: {{ .Values.serve.httpPort }}
  name: serve
- containerPort: {{ .Values.monitoring.metricsPort }}
  name: metrics
{{- end -}}

{{/* Values the schema cannot compare: each worker group's replicas within [minReplicas, maxReplicas]
(KubeRay would clamp them quietly), and GPU workers for the Targets when Ray's autoscaler cannot add one
(a Target replica that no node can hold leaves the app deploying forever). */}}
{{- define "gambit.validate" -}}
{{- range $key := list "gpuWorkers" "cpuWorkers" -}}
{{- $g := index $.Values $key -}}
{{- if gt (int $g.minReplicas) (int $g.maxReplicas) -}}
{{- fail (printf "%s: minReplicas %v is above maxReplicas %v" $key $g.minReplicas $g.maxReplicas) -}}
{{- end -}}
{{- if or (lt (int $g.replicas) (int $g.minReplicas)) (gt (int $g.replicas) (int $g.maxReplicas)) -}}
{{- fail (printf "%s.replicas: %v is outside [minReplicas %v, maxReplicas %v]" $key $g.replicas $g.minReplicas $g.maxReplicas) -}}
{{- end -}}
{{- end -}}
{{- if and (eq (int .Values.gpuWorkers.replicas) 0) (not .Values.autoscaling.enabled) -}}
{{- fail "gpuWorkers.replicas: 0 GPU workers with autoscaling.enabled false: no node could hold a Target replica" -}}
{{- end -}}
{{- end -}}
