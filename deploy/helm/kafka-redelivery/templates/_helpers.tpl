{{/* Names and labels shared by every object of a release. */}}

{{- define "kafka-redelivery.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name; a release already named after the chart is not repeated. */}}
{{- define "kafka-redelivery.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kafka-redelivery.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kafka-redelivery.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: tracker
{{- end -}}

{{/* Labels that say where an object comes from, without the component. */}}
{{- define "kafka-redelivery.releaseLabels" -}}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "kafka-redelivery.labels" -}}
{{ include "kafka-redelivery.selectorLabels" . }}
{{ include "kafka-redelivery.releaseLabels" . }}
{{- end -}}

{{- define "kafka-redelivery.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "kafka-redelivery.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "kafka-redelivery.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- define "kafka-redelivery.markersTopic" -}}
{{- required "tracker.markersTopic is required: the markers topic the clients write to" .Values.tracker.markersTopic -}}
{{- end -}}

{{/*
Environment shared by the tracker and the topics Job: where Kafka is, which topics, and the
librdkafka settings. SASL credentials come from the Secret the values name; the settings string
refers to them as $(VAR), which Kubernetes expands from the variables defined before it, so no
credential is ever written into a rendered object.
*/}}
{{- define "kafka-redelivery.kafkaEnv" -}}
- name: REDELIVERY_BROKERS
  value: {{ required "kafka.brokers is required" .Values.kafka.brokers | quote }}
- name: REDELIVERY_MARKERS_TOPIC
  value: {{ include "kafka-redelivery.markersTopic" . | quote }}
- name: REDELIVERY_DLQ_TOPIC
  value: {{ .Values.tracker.dlqTopic | quote }}
{{- with .Values.tracker.snapshotsTopic }}
- name: REDELIVERY_SNAPSHOTS_TOPIC
  value: {{ . | quote }}
{{- end }}
{{- $settings := list }}
{{- range $key, $value := .Values.kafka.settings }}
{{- $setting := printf "%s=%s" $key (include "kafka-redelivery.scalar" $value) }}
{{- if contains ";" $setting }}
{{- fail (printf "kafka.settings.%s: a value cannot contain ';' (it separates the settings)" $key) }}
{{- end }}
{{- $settings = append $settings $setting }}
{{- end }}
{{- with .Values.kafka.sasl }}
{{- if .mechanism }}
{{- $secret := required "kafka.sasl.existingSecret is required when kafka.sasl.mechanism is set" .existingSecret }}
- name: KAFKA_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ .usernameKey }}
- name: KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ .passwordKey }}
{{- $settings = concat $settings (list (printf "security.protocol=%s" .securityProtocol) (printf "sasl.mechanism=%s" .mechanism) "sasl.username=$(KAFKA_SASL_USERNAME)" "sasl.password=$(KAFKA_SASL_PASSWORD)") }}
{{- end }}
{{- end }}
{{- if $settings }}
- name: REDELIVERY_RDKAFKA
  value: {{ join ";" $settings | quote }}
{{- end }}
{{- end -}}

{{- define "kafka-redelivery.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "kafka-redelivery.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop: [ALL]
{{- end -}}

{{- define "kafka-redelivery.tlsVolumeMount" -}}
{{- with .Values.kafka.tls.existingSecret }}
volumeMounts:
  - name: kafka-tls
    mountPath: {{ $.Values.kafka.tls.mountPath }}
    readOnly: true
{{- end }}
{{- end -}}

{{- define "kafka-redelivery.tlsVolume" -}}
{{- with .Values.kafka.tls.existingSecret }}
volumes:
  - name: kafka-tls
    secret:
      secretName: {{ . }}
{{- end }}
{{- end -}}

{{/* Memory from the expected deliveries in flight (values.yaml, `sizing`), in MiB. */}}
{{- define "kafka-redelivery.memoryMiB" -}}
{{- $s := .Values.sizing -}}
{{- $bytes := mul (int64 $s.inFlight) (int64 $s.bytesPerInFlight) -}}
{{- $mib := div (add $bytes 1048575) 1048576 -}}
{{- add (int64 $s.baseMiB) $mib -}}
{{- end -}}

{{- define "kafka-redelivery.resources" -}}
{{- if .Values.resources -}}
{{- toYaml .Values.resources -}}
{{- else -}}
{{- $mib := include "kafka-redelivery.memoryMiB" . | int64 -}}
requests:
  cpu: {{ .Values.sizing.cpu | quote }}
  memory: {{ printf "%dMi" $mib }}
limits:
  memory: {{ printf "%dMi" (mul $mib 2) }}
{{- end -}}
{{- end -}}

{{/*
A value as the tracker reads it. Helm reads every number of a values file as a float, which
prints as 1e+07 from 10000000 on (and the tracker refuses that): whole numbers print as digits.
*/}}
{{- define "kafka-redelivery.scalar" -}}
{{- if and (kindIs "float64" .) (eq (float64 (int64 .)) .) -}}
{{- int64 . -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}
