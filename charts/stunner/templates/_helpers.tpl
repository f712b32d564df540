{{/*
Shared helpers. Names are cut to 63 characters: Kubernetes names and label values are DNS
labels.
*/}}

{{/* The chart's name. */}}
{{- define "stunner.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's base name: the release name, or release-chart when it does not say stunner. */}}
{{- define "stunner.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* A component's name: (tuple . "webhook") -> <fullname>-webhook. */}}
{{- define "stunner.componentName" -}}
{{- if ne (len .) 2 -}}
{{- fail (printf "ERROR: stunner.componentName expects (tuple <context> <component>), got %d arguments" (len .)) -}}
{{- end -}}
{{- $root := index . 0 -}}
{{- printf "%s-%s" (include "stunner.fullname" $root | trunc 50 | trimSuffix "-") (index . 1) -}}
{{- end -}}

{{/* Helm's recommended labels for one component: (tuple . "reconciler"). */}}
{{- define "stunner.labels" -}}
{{- $root := index . 0 -}}
helm.sh/chart: {{ printf "%s-%s" $root.Chart.Name $root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
app.kubernetes.io/part-of: stunner
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
{{ include "stunner.selectorLabels" . }}
{{- end -}}

{{/* The labels that select one component's pods: (tuple . "reconciler"). */}}
{{- define "stunner.selectorLabels" -}}
{{- if ne (len .) 2 -}}
{{- fail (printf "ERROR: stunner.selectorLabels expects (tuple <context> <component>), got %d arguments" (len .)) -}}
{{- end -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "stunner.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* The image reference: repository:tag, the tag defaulting to appVersion. */}}
{{- define "stunner.image" -}}
{{- $repository := required "ERROR: image.repository must be set" .Values.image.repository -}}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The dataplane image: stunnerd alone (the Dockerfile's `dataplane` target). */}}
{{- define "stunner.dataplaneImage" -}}
{{- $repository := required "ERROR: image.dataplaneRepository must be set" .Values.image.dataplaneRepository -}}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The reconciler's ServiceAccount. */}}
{{- define "stunner.reconcilerServiceAccount" -}}
{{- include "stunner.componentName" (tuple . "reconciler") -}}
{{- end -}}

{{/* The webhook's ServiceAccount, Service and Secret share its name. */}}
{{- define "stunner.webhookName" -}}
{{- include "stunner.componentName" (tuple . "webhook") -}}
{{- end -}}

{{/* The Secret holding the webhook's serving certificate. */}}
{{- define "stunner.webhookSecret" -}}
{{- printf "%s-tls" (include "stunner.webhookName" .) -}}
{{- end -}}

{{/* The CDS URL every stunnerd pod is pointed at: a Service name, never a pod address. */}}
{{- define "stunner.cdsURL" -}}
{{- printf "http://%s.%s.svc:%d" .Values.reconciler.cds.serviceName .Release.Namespace (int .Values.reconciler.cds.port) -}}
{{- end -}}

{{/*
The webhook's serving certificate and CA: generated on install, then read back from the
Secret on upgrade (lookup) so that the caBundle and the certificate stay the same. Returns a
dict {crt, key, ca} (base64) as YAML, made once per render and shared by the Secret and both
webhook configurations; `helm template` (no cluster) generates a fresh pair each time.
*/}}
{{- define "stunner.webhookCertificate" -}}
{{- if not (hasKey . "stunnerWebhookCertificate") -}}
{{- $secret := lookup "v1" "Secret" .Release.Namespace (include "stunner.webhookSecret" .) -}}
{{- $pem := dict -}}
{{- if and $secret $secret.data (hasKey $secret.data "ca.crt") -}}
{{- $pem = dict "crt" (index $secret.data "tls.crt") "key" (index $secret.data "tls.key") "ca" (index $secret.data "ca.crt") -}}
{{- else -}}
{{- $service := include "stunner.webhookName" . -}}
{{- $days := int .Values.webhook.certificate.validityDays -}}
{{- $ca := genCA (printf "%s-ca" $service) $days -}}
{{- $names := list $service (printf "%s.%s" $service .Release.Namespace) (printf "%s.%s.svc" $service .Release.Namespace) -}}
{{- $cert := genSignedCert (printf "%s.%s.svc" $service .Release.Namespace) nil $names $days $ca -}}
{{- $pem = dict "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc) "ca" ($ca.Cert | b64enc) -}}
{{- end -}}
{{- $_ := set . "stunnerWebhookCertificate" $pem -}}
{{- end -}}
{{- index . "stunnerWebhookCertificate" | toYaml -}}
{{- end -}}

{{/*
The kinds the webhook judges, every served version (stunner_api.vocabulary.JUDGED_KINDS; the
test suite checks this list against it and against the CRDs): group -> resource -> versions.
DELETE is judged only where a rule judges it (stunner_api.rules.ON_DELETE: the default
Dataplane is never deleted).
*/}}
{{- define "stunner.judgedKinds" -}}
stunner.l7mp.io:
  gatewayconfigs: {versions: [v1, v1alpha1], delete: false}
  dataplanes: {versions: [v1, v1alpha1], delete: true}
  staticservices: {versions: [v1, v1alpha1], delete: false}
  udproutes: {versions: [v1], delete: false}
gateway.networking.k8s.io:
  gatewayclasses: {versions: [v1, v1beta1], delete: false}
  gateways: {versions: [v1, v1beta1], delete: false}
  udproutes: {versions: [v1, v1alpha2], delete: false}
  tcproutes: {versions: [v1alpha2], delete: false}
{{- end -}}

{{/*
The webhooks of one configuration: (tuple . "validate"|"mutate"). STUNner's own kinds get one
entry with webhook.failurePolicy; the Gateway API kinds (which other controllers share) one of
their own with webhook.gatewayAPIFailurePolicy. Dataplanes get an entry of their own that leaves
out this release's objects (its default Dataplane): `helm upgrade` patches it and `helm
uninstall` deletes it, and neither may depend on the webhook's pods being up (a fail-closed
webhook that is down, or not yet started, would block the upgrade that fixes it; the DELETE rule
would refuse the uninstall). Only cluster administrators write Dataplanes (cluster-scoped), so
the label it matches on is no tenant's way around the webhook.
With gatewayConfig.create the release also renders a GatewayConfig, created in the same `helm
install` as the webhook's pods: GatewayConfigs then join the Dataplanes' entry, which leaves the
release's objects out. A GatewayConfig is namespaced: whoever may write one in a namespace could
set the label and skip admission there (render still applies the same rule table, reporting in
status), which is why this happens only when the chart makes one.
*/}}
{{- define "stunner.webhooks" -}}
{{- $root := index . 0 -}}
{{- $path := index . 1 -}}
{{- $judged := include "stunner.judgedKinds" $root | fromYaml -}}
{{- $caBundle := "" -}}
{{- if not $root.Values.webhook.certificate.certManager -}}
{{- $caBundle = (include "stunner.webhookCertificate" $root | fromYaml).ca -}}
{{- end -}}
{{- $own := $root.Values.gatewayConfig.create -}}
{{- range $entry := list "stunner" "dataplane" "gateway-api" }}
- name: {{ $path }}-{{ $entry }}.stunner.l7mp.io
  admissionReviewVersions: [v1]
  sideEffects: None
  matchPolicy: Equivalent
  timeoutSeconds: {{ $root.Values.webhook.timeoutSeconds }}
  failurePolicy: {{ eq $entry "gateway-api" | ternary $root.Values.webhook.gatewayAPIFailurePolicy $root.Values.webhook.failurePolicy }}
  clientConfig:
    service:
      name: {{ include "stunner.webhookName" $root }}
      namespace: {{ $root.Release.Namespace }}
      path: /{{ $path }}
      port: 443
    {{- if $caBundle }}
    caBundle: {{ $caBundle }}
    {{- end }}
  namespaceSelector:
    matchExpressions:
      - key: kubernetes.io/metadata.name
        operator: NotIn
        values: {{ concat (list "kube-system") $root.Values.webhook.excludedNamespaces | toJson }}
  {{- if eq $entry "dataplane" }}
  objectSelector:
    matchExpressions:
      - key: app.kubernetes.io/instance
        operator: NotIn
        values: [{{ $root.Release.Name | quote }}]
  {{- end }}
  rules:
  {{- range $group := keys $judged | sortAlpha }}
  {{- range $resource := keys (index $judged $group) | sortAlpha }}
  {{- $kind := index $judged $group $resource }}
  {{- $in := ternary "dataplane" "stunner" (and (eq $group "stunner.l7mp.io") (eq $resource "dataplanes")) }}
  {{- if and $own (eq $group "stunner.l7mp.io") (eq $resource "gatewayconfigs") }}{{ $in = "dataplane" }}{{ end }}
  {{- if eq $group "gateway.networking.k8s.io" }}{{ $in = "gateway-api" }}{{ end }}
  {{- if eq $in $entry }}
    - apiGroups: [{{ $group }}]
      apiVersions: {{ $kind.versions | toJson }}
      resources: [{{ $resource }}]
      operations: {{ and $kind.delete (eq $path "validate") | ternary (list "CREATE" "UPDATE" "DELETE") (list "CREATE" "UPDATE") | toJson }}
      scope: "*"
  {{- end }}
  {{- end }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* Where the image installs the webhook's gunicorn configuration (the Dockerfile's venv). */}}
{{- define "stunner.webhookGunicornConf" -}}
/opt/stunner/lib/python3.11/site-packages/webhook/gunicorn.conf.py
{{- end -}}

{{/* The Service (and route backend) of the `helm test` pod's echo peer. */}}
{{/* The Service (and route backend) of the `helm test` pod's echo peer. */}}
{{- define "stunner.testEcho" -}}
{{- include "stunner.componentName" (tuple . "test-echo") -}}
{{- end -}}

{{/* The name of `helm test`'s pod, and of every other test hook (the UDPRoutes and the
ReferenceGrant): helm 3.18 and 4.2.3 `helm test --logs` ask for the logs of a Pod named like each
test hook, and fail on a name no Pod has (helm/helm#6968, fixed after 4.2.3 by #32129). */}}
{{- define "stunner.testName" -}}
{{- include "stunner.componentName" (tuple . "test") -}}
{{- end -}}

{{/* `helm test` hooks other than the pod: made before it (weight -1), deleted once the test has
passed (their names read the pod's logs, not theirs), and by the next test run when it failed. */}}
{{- define "stunner.testHookAnnotations" -}}
helm.sh/hook: test
helm.sh/hook-weight: "-1"
helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end -}}

{{/* The CDS token of a pod that reads configs (cdsAuth): a projected ServiceAccount token of the
CDS's audience, as reconciler/render/manifests.py renders it into every stunnerd pod (the words
are stunner_api/vocabulary.py's; tests/charts check they agree). */}}
{{- define "stunner.cdsTokenVolume" -}}
- name: stunner-cds-token
  projected:
    sources:
      - serviceAccountToken:
          audience: stunner.l7mp.io/config-discovery
          expirationSeconds: 3600
          path: token
{{- end -}}

{{- define "stunner.cdsTokenMount" -}}
- {name: stunner-cds-token, mountPath: /var/run/secrets/stunner.l7mp.io/cds, readOnly: true}
{{- end -}}

{{- define "stunner.cdsTokenEnv" -}}
- {name: STUNNER_CDS_TOKEN_FILE, value: /var/run/secrets/stunner.l7mp.io/cds/token}
{{- end -}}

{{/*
The LoadBalancer Service annotations of the chart's GatewayConfig, as YAML: the preset's
(loadBalancer.presets, the one table), then loadBalancer.annotations over them. values.schema.json
refuses an unknown preset; this fails too, for a render that skips the schema.
*/}}
{{- define "stunner.lbAnnotations" -}}
{{- $name := .Values.loadBalancer.preset -}}
{{- $presets := .Values.loadBalancer.presets -}}
{{- $annotations := dict -}}
{{- if ne $name "none" -}}
{{- if not (hasKey $presets $name) -}}
{{- fail (printf "loadBalancer.preset: unknown preset %q: choose none or one of %s (README, \"LoadBalancer presets\")" $name (keys $presets | sortAlpha | join ", ")) -}}
{{- end -}}
{{- $annotations = deepCopy (index $presets $name | default dict) -}}
{{- end -}}
{{- range $key, $value := .Values.loadBalancer.annotations -}}
{{- $_ := set $annotations $key $value -}}
{{- end -}}
{{- $annotations | toYaml -}}
{{- end -}}

{{/* The post-install/upgrade hook waiting for the webhook (webhook-ready-*.yaml): "true" when it
is rendered: the webhook on, the check on, and the release's namespace one the webhook judges. */}}
{{- define "stunner.webhookReadyCheck" -}}
{{- $excluded := has .Release.Namespace (concat (list "kube-system") .Values.webhook.excludedNamespaces) -}}
{{- if and .Values.webhook.enabled .Values.webhook.readyCheck.enabled (not $excluded) -}}true{{- end -}}
{{- end -}}

{{/* Its hook annotations: (tuple . weight). */}}
{{- define "stunner.webhookReadyHook" -}}
helm.sh/hook: post-install,post-upgrade
helm.sh/hook-weight: {{ index . 1 | quote }}
helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end -}}
