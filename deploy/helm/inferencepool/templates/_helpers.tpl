{{/*
Names and labels as GIE's chart has them, so selectors and ServiceMonitors written for it still match.
*/}}
{{- define "inferencepool.name" -}}
{{- $base := .Release.Name | default "default-pool" | lower | trim | trunc 40 -}}
{{ $base }}-epp
{{- end -}}

{{- define "inferencepool.clusterName" -}}
{{- $base := .Release.Name | default "default-pool" | lower | trim | trunc 40 -}}
{{- $ns := .Release.Namespace | default "default" | lower | trim | trunc 40 -}}
{{ printf "%s-%s-epp" $base $ns }}
{{- end -}}

{{- define "inferencepool.labels" -}}
app.kubernetes.io/name: {{ include "inferencepool.name" . }}
app.kubernetes.io/component: endpoint-picker
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
{{- end -}}

{{- define "inferencepool.selectorLabels" -}}
{{- $v := include "inferencepool.values" . | fromYaml -}}
{{- if $v.createPool -}}
inferencepool: {{ include "inferencepool.name" . }}
{{- else -}}
epp: {{ include "inferencepool.name" . }}
{{- end -}}
{{- end -}}

{{- define "inferencepool.modeLabels" -}}
{{- $v := include "inferencepool.values" . | fromYaml -}}
inference.networking.k8s.io/igw-mode: {{ ternary "inferencepool" "standalone" $v.createPool }}
{{- end -}}

{{/*
Merge src into dst as Helm merges values: maps key by key, anything else replaced. Mutates dst.
*/}}
{{- define "inferencepool.merge" -}}
{{- $dst := .dst -}}
{{- range $k, $val := .src -}}
{{- if and (kindIs "map" $val) (kindIs "map" (index $dst $k)) -}}
{{- include "inferencepool.merge" (dict "dst" (index $dst $k) "src" $val) -}}
{{- else -}}
{{- $_ := set $dst $k $val -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
One normalised view of the values, as YAML: GIE's keys, with llm-d-router's router.* / httpRoute.*
mapped onto them (docs/helm.md), and what the templates derive from both. Every template reads this.
*/}}
{{- define "inferencepool.values" -}}
{{- $epp := deepCopy .Values.inferenceExtension -}}
{{- $pool := deepCopy .Values.inferencePool -}}
{{- $route := deepCopy .Values.experimentalHttpRoute -}}
{{- $objectives := .Values.inferenceObjectives | default list -}}
{{- $createPool := true -}}
{{- $r := .Values.router | default dict -}}
{{- /* llm-d-router: router.epp.* is inferenceExtension.*, with a few moves */ -}}
{{- with $r.epp -}}
{{- include "inferencepool.merge" (dict "dst" $epp "src" (omit . "parsers")) -}}
{{- with .parsers -}}
{{- if eq (len .) 1 -}}
{{- $_ := set $pool "parser" (first .) -}}
{{- else -}}
{{- $_ := set $pool "parsers" . -}}{{- /* several: requestHandler.parsers, resolved per request by path */ -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- range $from, $to := dict "monitoring" "monitoring" "tracing" "tracing" "latencyPredictor" "latencyPredictor" -}}
{{- with index $r $from -}}
{{- include "inferencepool.merge" (dict "dst" (index $epp $to) "src" .) -}}
{{- end -}}
{{- end -}}
{{- range $key := list "tokenizer" "proxy" -}}
{{- with index $r $key -}}
{{- include "inferencepool.merge" (dict "dst" (index $epp $key) "src" .) -}}
{{- end -}}
{{- end -}}
{{- if hasKey $r "extraServicePorts" -}}
{{- $_ := set $epp "extraServicePorts" $r.extraServicePorts -}}
{{- end -}}
{{- with $r.modelServers -}}
{{- if hasKey . "matchLabels" -}}
{{- $_ := set $pool "modelServers" (dict "matchLabels" .matchLabels) -}}
{{- end -}}
{{- range $from, $to := dict "type" "modelServerType" "protocol" "modelServerProtocol" "targetPorts" "targetPorts" -}}
{{- if hasKey $.Values.router.modelServers $from -}}
{{- $_ := set $pool $to (index $.Values.router.modelServers $from) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with $r.inferencePool -}}
{{- if hasKey . "failureMode" -}}
{{- $_ := set $epp "failureMode" .failureMode -}}
{{- end -}}
{{- if and (hasKey . "create") (not .create) -}}
{{- $createPool = false -}}
{{- end -}}
{{- end -}}
{{- if hasKey $r "inferenceObjectives" -}}
{{- $objectives = $r.inferenceObjectives | default list -}}
{{- end -}}
{{- with .Values.httpRoute -}}
{{- include "inferencepool.merge" (dict "dst" $route "src" (omit . "create")) -}}
{{- if hasKey . "create" -}}
{{- $_ := set $route "enabled" .create -}}
{{- end -}}
{{- end -}}
{{- /* GIE's standalone chart: inferenceExtension.endpointsServer */ -}}
{{- $standalone := dict -}}
{{- $es := $epp.endpointsServer | default dict -}}
{{- if and $es (hasKey $es "createInferencePool") (not $es.createInferencePool) -}}
{{- $createPool = false -}}
{{- $_ := set $standalone "selector" ($es.endpointSelector | default "") -}}
{{- $_ := set $standalone "targetPorts" (toString ($es.targetPorts | default "")) -}}
{{- with $es.modelServerType -}}
{{- $_ := set $pool "modelServerType" . -}}
{{- end -}}
{{- with $es.modelServerProtocol -}}
{{- $_ := set $pool "modelServerProtocol" . -}}
{{- end -}}
{{- else if not $createPool -}}
{{- $labels := list -}}
{{- range $k, $val := ($pool.modelServers | default dict).matchLabels -}}
{{- $labels = append $labels (printf "%s=%v" $k $val) -}}
{{- end -}}
{{- $ports := list -}}
{{- range $pool.targetPorts -}}
{{- $ports = append $ports (toString .number) -}}
{{- end -}}
{{- $_ := set $standalone "selector" (join "," $labels) -}}
{{- $_ := set $standalone "targetPorts" (join "," $ports) -}}
{{- end -}}
{{- /* llm-d-router's docs spell the InferencePool's FailClose as FailClosed */ -}}
{{- if eq (toString $epp.failureMode) "FailClosed" -}}
{{- $_ := set $epp "failureMode" "FailClose" -}}
{{- end -}}
{{- /* what the flags decide */ -}}
{{- $flags := $epp.flags | default dict -}}
{{- $leaderElection := gt (int $epp.replicas) 1 -}}
{{- if hasKey $flags "ha-enable-leader-election" -}}
{{- $leaderElection = eq (toString (index $flags "ha-enable-leader-election")) "true" -}}
{{- end -}}
{{- $secureServing := $epp.tls.secureServing -}}
{{- if hasKey $flags "secure-serving" -}}
{{- $secureServing = eq (toString (index $flags "secure-serving")) "true" -}}
{{- end -}}
{{- $metricsAuth := $epp.monitoring.prometheus.auth.enabled -}}
{{- if hasKey $flags "metrics-endpoint-auth" -}}
{{- $metricsAuth = eq (toString (index $flags "metrics-endpoint-auth")) "true" -}}
{{- end -}}
{{- /* active-active (issue 30): every replica ready, routing state shared with its peers. Our
  inferenceExtension.activeActive (true, or a map with enabled / peerPort), or llm-d-router's switch:
  replicas > 1 with flags.ha-enable-leader-election false */ -}}
{{- $aa := $epp.activeActive | default dict -}}
{{- if kindIs "bool" $aa }}{{ $aa = dict "enabled" $aa }}{{ end -}}
{{- $activeActive := false -}}
{{- if $aa.enabled -}}
{{- if and (hasKey $flags "ha-enable-leader-election") $leaderElection -}}
{{- fail ".Values.inferenceExtension.activeActive: every replica serves, so flags.ha-enable-leader-election must not be true (hot standby is replicas > 1 without activeActive)" -}}
{{- end -}}
{{- $activeActive = true -}}
{{- $leaderElection = false -}}
{{- else if and (gt (int $epp.replicas) 1) (hasKey $flags "ha-enable-leader-election") (not $leaderElection) -}}
{{- $activeActive = true -}}
{{- end -}}
{{- /* GKE preferred backends (llm-d-router's chart): a StatefulSet whose first pods are GKE's
  PREFERRED backends and the rest its DEFAULT (backup) ones, each pod behind its own Service; every
  pod ready, so no leader election */ -}}
{{- $pb := dict "enabled" false -}}
{{- with ((.Values.provider | default dict).gke | default dict).preferredBackends -}}
{{- if .enabled -}}
{{- $pb = dict "enabled" true
  "preferredReplicas" (int (.preferredReplicas | default 1))
  "defaultReplicas" (int (.defaultReplicas | default 1))
  "balancingMode" (.balancingMode | default "")
  "maxRatePerEndpoint" (.maxRatePerEndpoint | default 0)
  "capacityScalerPercent" (.capacityScalerPercent | default 0) -}}
{{- if not (hasKey $flags "ha-enable-leader-election") -}}
{{- $leaderElection = false -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* active-active's peer secret (--peer-secret-file): the Secret to mount, and whether the chart
  creates it. secret.name: the user's Secret; else <release>-epp-peer-secret, created unless
  secret.create is false (then the peer port is unauthenticated, as before) */ -}}
{{- $peerSecret := dict "name" "" "create" false -}}
{{- $np := dict "enabled" false "extraIngressPorts" list -}}
{{- if $activeActive -}}
{{- $s := $aa.secret | default dict -}}
{{- if $s.name -}}
{{- $peerSecret = dict "name" $s.name "create" false -}}
{{- else if ternary $s.create true (hasKey $s "create") -}}
{{- $peerSecret = dict "name" (printf "%s-peer-secret" (include "inferencepool.name" .)) "create" true -}}
{{- end -}}
{{- with $aa.networkPolicy -}}
{{- $np = dict "enabled" (eq (toString .enabled) "true") "extraIngressPorts" (.extraIngressPorts | default list) -}}
{{- end -}}
{{- end -}}
{{- /* the EPP workers per pod, each binding peerPort+2i and +2i+1 (docs/workers.md): flags.workers,
  else the EPP's default, the cores the pod may use, which the CPU limit rounded up caps (1500m: 2).
  Without either the chart cannot know the node's cores: 32 (room for more would run into the
  metrics port, 9090, from 44 workers with the default ports) */ -}}
{{- $workers := int (index $flags "workers" | default 0) -}}
{{- $cpu := toString ((($epp.resources | default dict).limits | default dict).cpu | default "") -}}
{{- if and (not $workers) $cpu -}}
{{- if hasSuffix "m" $cpu -}}
{{- $workers = int (ceil (divf (trimSuffix "m" $cpu) 1000)) -}}
{{- else -}}
{{- $workers = int (ceil $cpu) -}}
{{- end -}}
{{- end -}}
{{- if lt $workers 1 }}{{ $workers = 32 }}{{ end -}}
{{- $tracing := $epp.tracing.enabled -}}
{{- if hasKey $flags "tracing" -}}
{{- $tracing = eq (toString (index $flags "tracing")) "true" -}}
{{- end -}}
{{- $out := dict
  "epp" $epp
  "pool" $pool
  "route" $route
  "objectives" $objectives
  "provider" (.Values.provider | default (dict "name" "none"))
  "createPool" $createPool
  "standalone" $standalone
  "leaderElection" $leaderElection
  "activeActive" $activeActive
  "preferredBackends" $pb
  "peerPort" (int (index $flags "peer-port" | default $aa.peerPort | default 9004))
  "peerSecret" $peerSecret
  "peerNetworkPolicy" $np
  "workers" $workers
  "grpcPort" (int (index $flags "grpc-port" | default 9002))
  "metricsPort" (int (index $flags "metrics-port" | default 9090))
  "secureServing" $secureServing
  "metricsAuth" $metricsAuth
  "tracing" $tracing
  "healthPort" (int ($epp.grpcHealthPort | default 9003))
  "providerName" (lower (.Values.provider.name | default "none"))
-}}
{{- include "inferencepool.validate" (dict "v" $out "root" .) -}}
{{- toYaml $out -}}
{{- end -}}

{{/*
A flag value as the EPP's parser reads it: integers stay integers (YAML numbers arrive as floats).
*/}}
{{- define "inferencepool.flagValue" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) -}}
{{ int64 . }}
{{- else -}}
{{ . }}
{{- end -}}
{{- end -}}

{{/*
GKE preferred backends: one Service per StatefulSet pod, named as llm-d-router's chart names them
(ordinal 0 is <release>-epp, then -preferred-<i>, then -backup, -backup-<j>), with its GKE tier.
*/}}
{{- define "inferencepool.preferredServices" -}}
{{- $v := include "inferencepool.values" . | fromYaml -}}
{{- $pb := $v.preferredBackends -}}
{{- $name := include "inferencepool.name" . -}}
{{- $preferred := int $pb.preferredReplicas -}}
{{- $out := list -}}
{{- range $i := until (int (add $preferred $pb.defaultReplicas)) -}}
{{- $svc := printf "%s-preferred-%d" $name $i -}}
{{- $policy := printf "%s-preferred-%d" $.Release.Name $i -}}
{{- $tier := "PREFERRED" -}}
{{- if eq $i 0 -}}
{{- $svc = $name -}}
{{- $policy = $.Release.Name -}}
{{- else if ge $i $preferred -}}
{{- $tier = "DEFAULT" -}}
{{- $suffix := ternary "" (printf "-%d" (sub $i $preferred)) (eq $i $preferred) -}}
{{- $svc = printf "%s-backup%s" $name $suffix -}}
{{- $policy = printf "%s-backup%s" $.Release.Name $suffix -}}
{{- end -}}
{{- $out = append $out (dict "service" $svc "policy" $policy "tier" $tier "pod" (printf "%s-%d" $name $i)) -}}
{{- end -}}
{{- toYaml (dict "services" $out) -}}
{{- end -}}
