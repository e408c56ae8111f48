{{/*
Bad values fail the render with the field named, before anything is applied: a release never
half-installs. What GIE's and llm-d-router's charts check, plus the values this chart does not
render (so a user is told, rather than silently given less).
*/}}
{{- define "inferencepool.validate" -}}
{{- $v := .v -}}
{{- $root := .root -}}
{{- $r := $root.Values.router | default dict -}}
{{- if and $v.createPool (not ($v.pool.modelServers | default dict).matchLabels) -}}
{{- fail (ternary ".Values.router.modelServers.matchLabels is required" ".Values.inferencePool.modelServers.matchLabels is required" (hasKey $r "modelServers")) -}}
{{- end -}}
{{- if not $v.createPool -}}
{{- if not $v.standalone.selector -}}
{{- fail "standalone mode (no InferencePool) needs a label selector: inferenceExtension.endpointsServer.endpointSelector or router.modelServers.matchLabels" -}}
{{- end -}}
{{- if not (regexMatch "^[0-9]+(,[0-9]+)*$" $v.standalone.targetPorts) -}}
{{- fail (printf "standalone mode needs target ports as numbers, got %q (inferenceExtension.endpointsServer.targetPorts or router.modelServers.targetPorts)" $v.standalone.targetPorts) -}}
{{- end -}}
{{- if $v.objectives -}}
{{- fail "inferenceObjectives can only be set when the chart creates the InferencePool" -}}
{{- end -}}
{{- end -}}
{{- if not $v.pool.targetPorts -}}
{{- fail ".Values.inferencePool.targetPorts needs at least one {number: PORT}" -}}
{{- end -}}
{{- range $i, $p := $v.pool.targetPorts -}}
{{- if not (and (kindIs "map" $p) (hasKey $p "number")) -}}
{{- fail (printf ".Values.inferencePool.targetPorts[%d] must be {number: PORT}, got %v" $i $p) -}}
{{- end -}}
{{- end -}}
{{- if not (has $v.providerName (list "none" "gke" "istio")) -}}
{{- fail (printf ".Values.provider.name must be one of gke, istio, none; got %q" $root.Values.provider.name) -}}
{{- end -}}
{{- if not (has $v.pool.modelServerProtocol (list "http" "grpc")) -}}
{{- fail (printf ".Values.inferencePool.modelServerProtocol must be http or grpc, got %q" $v.pool.modelServerProtocol) -}}
{{- end -}}
{{- if not (has $v.epp.failureMode (list "FailOpen" "FailClose")) -}}
{{- fail (printf ".Values.inferenceExtension.failureMode must be FailOpen or FailClose, got %q" $v.epp.failureMode) -}}
{{- end -}}
{{- if lt (int $v.epp.replicas) 1 -}}
{{- fail (printf ".Values.inferenceExtension.replicas must be at least 1, got %v" $v.epp.replicas) -}}
{{- end -}}
{{- if not (and $v.epp.resources $v.epp.resources.requests) -}}
{{- fail ".Values.inferenceExtension.resources.requests is required: the EPP is on every request's path" -}}
{{- end -}}
{{- if ne $v.pool.apiVersion "inference.networking.k8s.io/v1" -}}
{{- fail (printf ".Values.inferencePool.apiVersion: only inference.networking.k8s.io/v1 is rendered, got %q" $v.pool.apiVersion) -}}
{{- end -}}
{{- if hasKey ($v.epp.pluginsCustomConfig | default dict) "default-plugins.yaml" -}}
{{- fail ".Values.inferenceExtension.pluginsCustomConfig: default-plugins.yaml is the chart's own; give yours another name and set pluginsConfigFile to it" -}}
{{- end -}}
{{- $files := keys ($v.epp.pluginsCustomConfig | default dict) | concat (list "default-plugins.yaml") -}}
{{- if not (has $v.epp.pluginsConfigFile $files) -}}
{{- fail (printf ".Values.inferenceExtension.pluginsConfigFile %q is not default-plugins.yaml nor a key of pluginsCustomConfig %v" $v.epp.pluginsConfigFile (keys ($v.epp.pluginsCustomConfig | default dict))) -}}
{{- end -}}
{{- if and $v.epp.tls.certSecretName (not $v.secureServing) -}}
{{- fail ".Values.inferenceExtension.tls.certSecretName is set but secure serving is off" -}}
{{- end -}}
{{- range $flag := list "pool-name" "pool-namespace" "endpoint-selector" "endpoint-target-ports" "config-file" "config-text" "grpc-health-port" -}}
{{- if hasKey ($v.epp.flags | default dict) $flag -}}
{{- fail (printf ".Values.inferenceExtension.flags.%s: the chart sets --%s from its other values; set those instead (docs/helm.md)" $flag $flag) -}}
{{- end -}}
{{- end -}}
{{- range $k, $_ := ($v.epp.flags | default dict) -}}
{{- if hasPrefix "-" $k -}}
{{- fail (printf ".Values.inferenceExtension.flags: write flag names without dashes, got %q" $k) -}}
{{- end -}}
{{- end -}}
{{- $key := ternary "router" "inferenceExtension" (hasKey $r "proxy") -}}
{{- with $v.epp.proxy -}}
{{- if .enabled -}}
{{- if ne (toString .proxyType) "envoy" -}}
{{- fail (printf ".Values.%s.proxy.proxyType: only envoy is rendered, got %q (agentgateway's config is not one this project tests)" $key .proxyType) -}}
{{- end -}}
{{- if ne (toString .mode) "sidecar" -}}
{{- fail (printf ".Values.%s.proxy.mode: only sidecar is rendered, got %q; for a separate, scaled Envoy run deploy/envoy/active-active.yaml in front of the EPP Service" $key .mode) -}}
{{- end -}}
{{- if not (regexMatch "^[0-9]+$" (toString .port)) -}}
{{- fail (printf ".Values.%s.proxy.port must be a port number, got %q" $key (toString .port)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with $v.epp.tokenizer -}}
{{- if and .enabled (not .modelName) -}}
{{- fail (printf ".Values.%s.tokenizer.modelName is required when the tokenizer is enabled (vllm launch render <modelName>)" (ternary "router" "inferenceExtension" (hasKey $r "tokenizer"))) -}}
{{- end -}}
{{- end -}}
{{- if $v.preferredBackends.enabled -}}
{{- if ne $v.providerName "gke" -}}
{{- fail (printf ".Values.provider.gke.preferredBackends: GKE's preferred and backup backends need provider.name gke, got %q" $v.providerName) -}}
{{- end -}}
{{- range $key := list "preferredReplicas" "defaultReplicas" -}}
{{- if lt (int (index $v.preferredBackends $key)) 1 -}}
{{- fail (printf ".Values.provider.gke.preferredBackends.%s must be at least 1 when preferredBackends.enabled is true" $key) -}}
{{- end -}}
{{- end -}}
{{- if $v.activeActive -}}
{{- fail ".Values.provider.gke.preferredBackends: GKE's preferred backends route on each pod's own state; it cannot be combined with activeActive (or ha-enable-leader-election: false)" -}}
{{- end -}}
{{- end -}}
{{- if and $v.epp.sidecar.enabled (not (and $v.epp.sidecar.name $v.epp.sidecar.image)) -}}
{{- fail ".Values.inferenceExtension.sidecar needs name and image when enabled" -}}
{{- end -}}
{{- end -}}
