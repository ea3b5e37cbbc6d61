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

{{/* image.tag may be a number (--set image.tag=2, or tag: 20240101 in a values file, which Helm reads as a
float): render it as the digits, never as 2.0240101e+07. */}}
{{- define "gambit.image" -}}
{{- $tag := .Values.image.tag -}}
{{- if and (kindIs "float64" $tag) (eq (float64 $tag) (floor $tag)) -}}{{- $tag = int64 $tag -}}{{- end -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion (toString $tag)) -}}
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

{{/* A sequence scorer keeps each trace's history in its replica: it runs as one replica, never autoscaled. */}}
{{- define "gambit.sequenceScorer" -}}
{{- $scorer := .Values.serve.scorer -}}
{{- if or (eq $scorer "sequence") (hasPrefix "random:sequence" $scorer) -}}true{{- end -}}
{{- end -}}

{{/* Target replicas one GPU worker holds: floor(gpusPerWorker / numGpus) (numGpus 0: one per GPU). The
small epsilon keeps float division from flooring e.g. 7 / 0.14 (49.99999999999999) to 49. */}}
{{- define "gambit.targetsPerWorker" -}}
{{- $t := .Values.serve.deployments.Target -}}
{{- $gpw := .Values.gpuWorkers.gpusPerWorker -}}
{{- if gt (float64 $t.numGpus) 0.0 -}}
{{- floor (addf (divf $gpw $t.numGpus) 0.000001) | int -}}
{{- else -}}
{{- $gpw | int -}}
{{- end -}}
{{- end -}}

{{/* Target replicas when neither numReplicas nor autoscaling is set: what the GPU workers hold. */}}
{{- define "gambit.targetReplicas" -}}
{{- max 1 (mul (int .Values.gpuWorkers.replicas) (include "gambit.targetsPerWorker" . | int)) -}}
{{- end -}}

{{/* One Serve deployment's options. Replicas, in this order: a sequence Scorer runs 1; an explicit
numReplicas wins (the Scorer's then with autoscaling_config null: its code autoscales, and Serve keeps
that under a bare num_replicas); else an autoscaling block becomes autoscaling_config; else the Target runs one replica
per GPU slot and the others run 1. */}}
{{- define "gambit.deployment" -}}
{{- $d := index .root.Values.serve.deployments .name -}}
{{- $opts := dict "num_cpus" $d.numCpus "num_gpus" $d.numGpus -}}
{{- if $d.resources -}}{{- $_ := set $opts "resources" $d.resources -}}{{- end -}}
{{- $out := dict "name" .name "max_ongoing_requests" $d.maxOngoingRequests "ray_actor_options" $opts -}}
{{- /* Serve's health check and stop (gambit.ops.serve_config.TIMINGS) */ -}}
{{- $_ := set $out "health_check_period_s" $d.healthCheckPeriodS -}}
{{- $_ := set $out "health_check_timeout_s" $d.healthCheckTimeoutS -}}
{{- $_ := set $out "graceful_shutdown_wait_loop_s" $d.gracefulShutdownWaitLoopS -}}
{{- $_ := set $out "graceful_shutdown_timeout_s" $d.gracefulShutdownTimeoutS -}}
{{- if and (eq .name "Scorer") (include "gambit.sequenceScorer" .root) -}}
{{- $_ := set $out "num_replicas" 1 -}}
{{- else if not (kindIs "invalid" $d.numReplicas) -}}
{{- $_ := set $out "num_replicas" $d.numReplicas -}}
{{- if eq .name "Scorer" -}}{{- $_ := set $out "autoscaling_config" nil -}}{{- end -}}
{{- else if $d.autoscaling -}}
{{- $_ := set $out "autoscaling_config" $d.autoscaling -}}
{{- else if eq .name "Target" -}}
{{- $_ := set $out "num_replicas" (include "gambit.targetReplicas" .root | int) -}}
{{- else -}}
{{- $_ := set $out "num_replicas" 1 -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* The most replicas a rendered deployment (gambit.deployment, parsed) can run. */}}
{{- define "gambit.maxReplicas" -}}
{{- if hasKey . "num_replicas" -}}{{- .num_replicas | int -}}{{- else -}}{{- .autoscaling_config.max_replicas | int -}}{{- end -}}
{{- end -}}

{{/* "N Target replica(s)" or the autoscaling range, for NOTES. */}}
{{- define "gambit.targetSummary" -}}
{{- $t := include "gambit.deployment" (dict "root" . "name" "Target") | fromJson -}}
{{- if hasKey $t "num_replicas" -}}
{{- printf "%d Target replica(s)" ($t.num_replicas | int) -}}
{{- else -}}
{{- $a := $t.autoscaling_config -}}
{{- printf "%d to %d Target replicas, autoscaled by Serve" ($a.min_replicas | int) ($a.max_replicas | int) -}}
{{- end -}}
{{- end -}}

{{/* Where the workers mount serve.scorerTls.secret (gambit.ops.serve_config.SCORER_TLS_DIR). */}}
{{- define "gambit.scorerTlsDir" -}}/etc/gambit/scorer-tls{{- end -}}

{{/* The Scorer TLS Secret's volume and its mount, for a worker group's pod spec and Ray container. */}}
{{- define "gambit.scorerTlsVolumes" -}}
{{- with (.Values.serve.scorerTls | default dict).secret }}
volumes:
  - name: scorer-tls
    secret:
      secretName: {{ . }}
{{- end }}
{{- end -}}

{{- define "gambit.scorerTlsMounts" -}}
{{- if (.Values.serve.scorerTls | default dict).secret }}
volumeMounts:
  - name: scorer-tls
    mountPath: {{ include "gambit.scorerTlsDir" . }}
    readOnly: true
{{- end }}
{{- end -}}

{{/* serveConfigV2: the Serve deploy config (same shape as deploy/serve-kubernetes.yaml). */}}
{{- define "gambit.serveConfig" -}}
{{- $s := .Values.serve -}}
{{- $target := include "gambit.deployment" (dict "root" . "name" "Target") | fromJson -}}
{{- $coord := include "gambit.deployment" (dict "root" . "name" "Coordinator") | fromJson -}}
{{- $scorer := include "gambit.deployment" (dict "root" . "name" "Scorer") | fromJson -}}
{{- $targetArgs := dict "model" $s.model "scorer" $s.scorer "scorer_address" (printf "127.0.0.1:%v" $s.grpcPort) "scorer_app" "scorer" "num_blocks" $s.numBlocks "cpu_weights" $s.cpuWeights "kv_dtype" $s.kvDtype "batch_invariant" $s.batchInvariant "drafters" $s.drafters "threads" $s.targetThreads "max_num_seqs" $s.maxNumSeqs -}}
{{- /* an outside Scorer is called as itself (no scorer_app: no Ray Scorer's direct endpoint in its place) */ -}}
{{- if $s.scorerAddress -}}{{- $_ := set $targetArgs "scorer_address" $s.scorerAddress -}}{{- $_ := set $targetArgs "scorer_app" "" -}}{{- end -}}
{{- $tls := $s.scorerTls | default dict -}}
{{- $dir := include "gambit.scorerTlsDir" . -}}
{{- $_ := set $targetArgs "scorer_tls_ca" (ternary (printf "%s/ca.crt" $dir) "" (not (empty $tls.secret))) -}}
{{- $_ := set $targetArgs "scorer_tls_cert" (ternary (printf "%s/tls.crt" $dir) "" (and (not (empty $tls.secret)) (eq $tls.clientCert true))) -}}
{{- $_ := set $targetArgs "scorer_tls_key" (ternary (printf "%s/tls.key" $dir) "" (and (not (empty $tls.secret)) (eq $tls.clientCert true))) -}}
{{- $_ := set $targetArgs "scorer_tls_server_name" ($tls.serverName | default "") -}}
{{- if not (kindIs "invalid" $s.specMaxBatch) -}}{{- $_ := set $targetArgs "spec_max_batch" $s.specMaxBatch -}}{{- end -}}
{{- $gambitArgs := dict "tree" (include "gambit.redisUrl" .) "prefix" $s.redisPrefix "retention_s" $s.retentionS "token_env" $s.tokenEnv "target_replicas" (include "gambit.maxReplicas" $target | int) "target_gpus" $s.deployments.Target.numGpus "coordinator_replicas" (include "gambit.maxReplicas" $coord | int) "coordinator" (dict "max_resumes" $s.maxResumes "resume_wait_s" $s.resumeWaitS) "target" $targetArgs "defaults" $s.solveDefaults -}}
{{- $scorerArgs := dict "scorer" $s.scorer "model" $s.model "hidden_size" $s.hiddenSize "batch_wait_ms" $s.batchWaitMs "token_env" $s.tokenEnv "max_keys" $s.maxKeys "max_state_mb" $s.maxStateMb "max_rows" $s.maxRows -}}
{{- $gambitApp := dict "name" "gambit" "route_prefix" "/gambit" "import_path" "gambit.deployments.app:build_gambit" "args" $gambitArgs "deployments" (list $coord $target) -}}
{{- /* an outside Scorer (serve.scorerAddress): no Target calls the scorer app, so it is not deployed */ -}}
{{- $scorerApp := dict "name" "scorer" "route_prefix" "/scorer" "import_path" "gambit.deployments.app:build_scorer" "args" $scorerArgs "deployments" (list $scorer) -}}
{{- $cfg := dict "proxy_location" "EveryNode" "http_options" (dict "host" "0.0.0.0" "port" $s.httpPort) "grpc_options" (dict "port" $s.grpcPort "grpc_servicer_functions" $s.grpcServicerFunctions) "applications" (ternary (list $gambitApp) (list $gambitApp $scorerApp) (not (empty $s.scorerAddress))) -}}
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

{{/* CPUs Ray gives one worker of a group (.: the group's values), as KubeRay derives them: rayStartParams
num-cpus, else the CPU limit, else the CPU request, rounded up. -1 when unknown (nothing to check). */}}
{{- define "gambit.groupCpus" -}}
{{- $res := .resources | default dict -}}
{{- $q := "" -}}
{{- if hasKey (.rayStartParams | default dict) "num-cpus" -}}{{- $q = index .rayStartParams "num-cpus" -}}
{{- else if hasKey ($res.limits | default dict) "cpu" -}}{{- $q = $res.limits.cpu -}}
{{- else if hasKey ($res.requests | default dict) "cpu" -}}{{- $q = $res.requests.cpu -}}
{{- end -}}
{{- $q = toString $q -}}
{{- if regexMatch "^[0-9]+(\\.[0-9]*)?m$" $q -}}{{- ceil (divf (trimSuffix "m" $q) 1000) | int -}}
{{- else if regexMatch "^[0-9]+(\\.[0-9]*)?$" $q -}}{{- ceil $q | int -}}
{{- else -}}-1
{{- end -}}
{{- end -}}

{{/* rayStartParams of a group: the chart's own keys and the user's, one map. A user key the chart sets
is refused (gambit.validate) rather than silently replaced. */}}
{{- define "gambit.rayStartParams" -}}
{{- toYaml (merge (dict) .chart (.user | default dict)) -}}
{{- end -}}

{{/* Values the schema cannot compare, each refused with one line naming the value to change: settings
that would leave a Serve replica that no node can hold (the app then stays DEPLOYING forever and a
NewCluster upgrade never switches), port clashes, keys the chart sets, duplicate names. */}}
{{- define "gambit.validate" -}}
{{- $v := .Values -}}
{{- range $key := list "gpuWorkers" "cpuWorkers" -}}
{{- $g := index $v $key -}}
{{- if gt (int $g.minReplicas) (int $g.maxReplicas) -}}
{{- fail (printf "%s: minReplicas %v is above maxReplicas %v" $key $g.minReplicas $g.maxReplicas) -}}
{{- end -}}
{{- if or (lt (int $g.replicas) (int $g.minReplicas)) (gt (int $g.replicas) (int $g.maxReplicas)) -}}
{{- fail (printf "%s.replicas: %v is outside [minReplicas %v, maxReplicas %v]" $key $g.replicas $g.minReplicas $g.maxReplicas) -}}
{{- end -}}
{{- end -}}
{{- $auto := $v.autoscaling.enabled | default false -}}
{{- if and (eq (int $v.gpuWorkers.replicas) 0) (not $auto) -}}
{{- fail "gpuWorkers.replicas: 0 GPU workers with autoscaling.enabled false: no node could hold a Target replica" -}}
{{- end -}}
{{- if and (eq (int $v.cpuWorkers.replicas) 0) (not $auto) -}}
{{- fail "cpuWorkers.replicas: 0 CPU workers with autoscaling.enabled false: no node could hold the Coordinator or the Scorer (only that group advertises gambit_cpu_worker)" -}}
{{- end -}}
{{- if eq $v.gpuWorkers.groupName $v.cpuWorkers.groupName -}}
{{- fail (printf "cpuWorkers.groupName: %q is also gpuWorkers.groupName; KubeRay needs distinct group names" $v.cpuWorkers.groupName) -}}
{{- end -}}
{{- /* labels the chart sets (a second copy of a key in metadata.labels: the object no longer says what selects it) */ -}}
{{- range $k, $_ := $v.commonLabels | default dict -}}
{{- if has $k (list "helm.sh/chart" "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/version" "app.kubernetes.io/managed-by" "app.kubernetes.io/component") -}}
{{- fail (printf "commonLabels.%s: set by the chart (it names and selects the chart's objects); use another key" $k) -}}
{{- end -}}
{{- end -}}
{{- $name := include "gambit.fullname" . -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- fail (printf "fullnameOverride (or the release name): %q is not a valid name for the RayService and its Services (lowercase letters, digits and '-', starting with a letter)" $name) -}}
{{- end -}}
{{- /* ports: one each for the Serve proxies (gRPC, HTTP) and Ray's metrics, none of Ray's own */ -}}
{{- $ports := list (list "serve.grpcPort" $v.serve.grpcPort) (list "serve.httpPort" $v.serve.httpPort) (list "monitoring.metricsPort" $v.monitoring.metricsPort) -}}
{{- range $i, $a := $ports -}}
{{- if has (int (index $a 1)) (list 6379 8265 10001 52365) -}}
{{- fail (printf "%s: %v is a port Ray itself uses on its pods (6379 GCS, 8265 dashboard, 10001 client, 52365 dashboard agent)" (index $a 0) (index $a 1)) -}}
{{- end -}}
{{- range $j, $b := $ports -}}
{{- if and (lt $i $j) (eq (int (index $a 1)) (int (index $b 1))) -}}
{{- fail (printf "%s: %v is also %s; every Ray pod needs one port for each" (index $b 0) (index $b 1) (index $a 0)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* keys the chart sets itself */ -}}
{{- $reserved := dict "head" (dict "num-cpus" "the head runs no replicas" "dashboard-host" "KubeRay reaches the dashboard on 0.0.0.0" "metrics-export-port" "set monitoring.metricsPort") "gpuWorkers" (dict "num-gpus" "set gpuWorkers.gpusPerWorker" "metrics-export-port" "set monitoring.metricsPort") "cpuWorkers" (dict "resources" "the chart advertises gambit_cpu_worker there, which the Coordinator and Scorer need" "metrics-export-port" "set monitoring.metricsPort") -}}
{{- range $group, $keys := $reserved -}}
{{- range $k, $why := $keys -}}
{{- if hasKey ((index $v $group).rayStartParams | default dict) $k -}}
{{- fail (printf "%s.rayStartParams.%s: set by the chart (%s)" $group $k $why) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $part := list "requests" "limits" -}}
{{- if hasKey (index ($v.gpuWorkers.resources | default dict) $part | default dict) "nvidia.com/gpu" -}}
{{- fail (printf "gpuWorkers.resources.%s.nvidia.com/gpu: set by the chart; set gpuWorkers.gpusPerWorker instead" $part) -}}
{{- end -}}
{{- end -}}
{{- /* env names: each once per container */ -}}
{{- $extra := $v.serve.extraEnv | default dict -}}
{{- if eq $v.serve.tokenEnv "GAMBIT_REDIS_PASSWORD" -}}
{{- fail "serve.tokenEnv: GAMBIT_REDIS_PASSWORD holds the Redis password; pick another name" -}}
{{- end -}}
{{- if hasKey $extra "GAMBIT_REDIS_PASSWORD" -}}
{{- fail "serve.extraEnv.GAMBIT_REDIS_PASSWORD: set by the chart from the Redis Secret (redis.auth / redis.external)" -}}
{{- end -}}
{{- if and $v.serve.tokenSecret (hasKey $extra $v.serve.tokenEnv) -}}
{{- fail (printf "serve.extraEnv.%s: set by the chart from serve.tokenSecret" $v.serve.tokenEnv) -}}
{{- end -}}
{{- /* a Service reachable from outside the cluster answers anyone: only with a token, or when asked */ -}}
{{- if and (ne $v.grpcService.type "ClusterIP") (not $v.serve.tokenSecret) (not $v.grpcService.allowUnauthenticated) -}}
{{- fail (printf "grpcService.type: %s exposes the ReasoningService with no bearer token (serve.tokenSecret is empty): anyone who reaches it can Solve and read or cancel runs; set serve.tokenSecret to a Secret with key `token`, or grpcService.allowUnauthenticated=true" $v.grpcService.type) -}}
{{- end -}}
{{- /* an outside Scorer over TLS */ -}}
{{- $tls := $v.serve.scorerTls | default dict -}}
{{- if and (not $tls.secret) (or $tls.clientCert $tls.serverName) -}}
{{- fail "serve.scorerTls.secret: needed with serve.scorerTls.clientCert / serverName (they are for TLS; the Secret's ca.crt verifies the Scorer)" -}}
{{- end -}}
{{- if and $tls.secret (not $v.serve.scorerAddress) -}}
{{- fail "serve.scorerTls.secret: set only with serve.scorerAddress (a TLS ScorerService outside Ray, e.g. `gambit scorer serve --tls-cert`): the scorer app behind Serve's proxy is plaintext" -}}
{{- end -}}
{{- /* the engine batch against what fills it (gambit.ops.serve_config.check_engine_batch) */ -}}
{{- $capacity := ($v.serve.solveDefaults | default dict).capacity | default 8 -}}
{{- if gt (int $capacity) (int $v.serve.maxNumSeqs) -}}
{{- fail (printf "serve.maxNumSeqs: %v is below serve.solveDefaults.capacity %v: every Gambit request left at the default would be refused at admission; raise serve.maxNumSeqs or lower the capacity" $v.serve.maxNumSeqs $capacity) -}}
{{- end -}}
{{- if and (not $v.serve.scorerAddress) (lt (int $v.serve.maxRows) (int $v.serve.maxNumSeqs)) -}}
{{- fail (printf "serve.maxRows: %v is below serve.maxNumSeqs %v: a step's boundaries (a row per trace in the batch) would be refused by the Scorer and fall back unguided; raise serve.maxRows or lower serve.maxNumSeqs" $v.serve.maxRows $v.serve.maxNumSeqs) -}}
{{- end -}}
{{- /* Serve replicas */ -}}
{{- range $dname, $d := $v.serve.deployments -}}
{{- with $d.autoscaling -}}
{{- if gt (int .min_replicas) (int .max_replicas) -}}
{{- fail (printf "serve.deployments.%s.autoscaling: min_replicas %v is above max_replicas %v" $dname .min_replicas .max_replicas) -}}
{{- end -}}
{{- if and (hasKey . "initial_replicas") (or (lt (int .initial_replicas) (int .min_replicas)) (gt (int .initial_replicas) (int .max_replicas))) -}}
{{- fail (printf "serve.deployments.%s.autoscaling: initial_replicas %v is outside [min_replicas, max_replicas]" $dname .initial_replicas) -}}
{{- end -}}
{{- end -}}
{{- if gt (float64 $d.gracefulShutdownWaitLoopS) (float64 $d.gracefulShutdownTimeoutS) -}}
{{- fail (printf "serve.deployments.%s.gracefulShutdownWaitLoopS: %v is above gracefulShutdownTimeoutS %v: Serve would kill every stopping replica before its first drain poll" $dname $d.gracefulShutdownWaitLoopS $d.gracefulShutdownTimeoutS) -}}
{{- end -}}
{{- end -}}
{{- $sc := $v.serve.deployments.Scorer -}}
{{- if and (include "gambit.sequenceScorer" .) (not (kindIs "invalid" $sc.numReplicas)) (ne (int $sc.numReplicas) 1) -}}
{{- fail (printf "serve.deployments.Scorer.numReplicas: %v, but serve.scorer %q keeps each trace's history in its replica and runs one" $sc.numReplicas $v.serve.scorer) -}}
{{- end -}}
{{- /* GPU group: every Target replica needs a GPU slot */ -}}
{{- $t := $v.serve.deployments.Target -}}
{{- $gpu := $v.gpuWorkers -}}
{{- if gt (float64 $t.numGpus) (float64 $gpu.gpusPerWorker) -}}
{{- fail (printf "serve.deployments.Target.numGpus: %v is above gpuWorkers.gpusPerWorker %v; no GPU worker could hold a Target" $t.numGpus $gpu.gpusPerWorker) -}}
{{- end -}}
{{- $gpuWorkers := ternary $gpu.maxReplicas $gpu.replicas $auto | int -}}
{{- $perWorker := include "gambit.targetsPerWorker" . | int -}}
{{- $targetMax := include "gambit.maxReplicas" (include "gambit.deployment" (dict "root" . "name" "Target") | fromJson) | int -}}
{{- if gt $targetMax (mul $gpuWorkers $perWorker) -}}
{{- fail (printf "serve.deployments.Target: up to %d replicas, but %d GPU worker(s) (gpuWorkers.%s) hold %d (%d each: gpusPerWorker %v / numGpus %v); add GPU workers or lower the Target's replicas" $targetMax $gpuWorkers (ternary "maxReplicas" "replicas" $auto) (mul $gpuWorkers $perWorker) $perWorker $gpu.gpusPerWorker $t.numGpus) -}}
{{- end -}}
{{- $gpuCpus := include "gambit.groupCpus" $gpu | int -}}
{{- if and (ge $gpuCpus 0) (gt (mulf $targetMax $t.numCpus) (mul $gpuCpus $gpuWorkers | float64)) -}}
{{- fail (printf "serve.deployments.Target: up to %d replicas x numCpus %v, but %d GPU worker(s) have %d CPUs each (gpuWorkers.resources.limits.cpu)" $targetMax $t.numCpus $gpuWorkers $gpuCpus) -}}
{{- end -}}
{{- /* CPU group: the Coordinator and the Scorer (they ask for gambit_cpu_worker) at their most replicas */ -}}
{{- $cpu := $v.cpuWorkers -}}
{{- $cpuWorkers := ternary $cpu.maxReplicas $cpu.replicas $auto | int -}}
{{- $cpuCpus := include "gambit.groupCpus" $cpu | int -}}
{{- $need := 0.0 -}}
{{- range $dname := ternary (list "Coordinator") (list "Coordinator" "Scorer") (not (empty $v.serve.scorerAddress)) -}}
{{- $d := index $v.serve.deployments $dname -}}
{{- if hasKey ($d.resources | default dict) "gambit_cpu_worker" -}}
{{- $n := include "gambit.maxReplicas" (include "gambit.deployment" (dict "root" $ "name" $dname) | fromJson) | int -}}
{{- $need = addf $need (mulf $n $d.numCpus) -}}
{{- end -}}
{{- end -}}
{{- if and (ge $cpuCpus 0) (gt $need (mul $cpuCpus $cpuWorkers | float64)) -}}
{{- fail (printf "cpuWorkers: %s up to %v CPUs (replicas x numCpus), but %d CPU worker(s) (cpuWorkers.%s) have %d CPUs each (cpuWorkers.resources.limits.cpu)" (ternary "the Coordinator needs" "the Coordinator and Scorer need" (not (empty $v.serve.scorerAddress))) $need $cpuWorkers (ternary "maxReplicas" "replicas" $auto) $cpuCpus) -}}
{{- end -}}
{{- end -}}

{{/* A pod's labels (.root, .component): the selector labels and its component, never the chart's version
(a chart upgrade would then restart every Ray pod: KubeRay starts a NewCluster on any template change). */}}
{{- define "gambit.podLabels" -}}
{{- include "gambit.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Where a pod runs (.root, .group: the group's values, .component): nodeSelector, tolerations, affinity,
priorityClassName and topologySpreadConstraints, each entry without a labelSelector given the pod's labels. */}}
{{- define "gambit.podPlacement" -}}
{{- with .group.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .group.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .group.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .group.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- $labels := include "gambit.podLabels" . | fromYaml }}
{{- with .group.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- range . }}
  {{- $c := deepCopy . }}
  {{- if not (hasKey $c "labelSelector") }}{{- $_ := set $c "labelSelector" (dict "matchLabels" $labels) }}{{- end }}
  - {{ toYaml $c | nindent 4 | trim }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* A Ray pod's spec apart from its containers and volumes (.root, .group, .component). The API token is
mounted only where something calls the API: the head with Ray's autoscaler (KubeRay gives it the RBAC). */}}
{{- define "gambit.rayPodSpec" -}}
{{- $v := .root.Values -}}
{{- with $v.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.serviceAccount.name }}
serviceAccountName: {{ . }}
{{- end }}
automountServiceAccountToken: {{ or $v.serviceAccount.automountToken (and (eq .component "head") $v.autoscaling.enabled) }}
{{- with $v.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- include "gambit.podPlacement" . }}
{{- end -}}

{{/* A Ray container's securityContext (values securityContext). */}}
{{- define "gambit.rayContainerSecurity" -}}
{{- with .Values.securityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
