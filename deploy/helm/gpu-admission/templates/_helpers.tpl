{{/*
The documents of one file under files/, as a list of objects (comment-only documents dropped).
*/}}
{{- define "gpu-admission.documents" -}}
{{- $objects := list -}}
{{- range $doc := regexSplit "(?m)^---[ \t]*$" (.root.Files.Get .file) -1 -}}
{{- $obj := fromYaml $doc -}}
{{- if and $obj (hasKey $obj "kind") -}}
{{- if hasKey $obj "Error" -}}{{- fail (printf "%s: %s" $.file $obj.Error) -}}{{- end -}}
{{- $objects = append $objects $obj -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "items" $objects) -}}
{{- end -}}

{{- define "gpu-admission.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/*
Finish one object: the labels kustomize adds (app.kubernetes.io/part-of on the object and its pod
template, never on selectors) and Helm's, our image, then the document.
*/}}
{{- define "gpu-admission.finish" -}}
{{- $obj := .obj -}}
{{- $root := .root -}}
{{- $meta := default dict $obj.metadata -}}
{{- $labels := default dict $meta.labels -}}
{{- if ne $obj.kind "CustomResourceDefinition" -}}{{- /* shared with other engines: not ours alone (as deploy/crds/) */ -}}
{{- $_ := set $labels "app.kubernetes.io/part-of" "gpu-admission" -}}
{{- end -}}
{{- $_ := set $labels "app.kubernetes.io/managed-by" $root.Release.Service -}}
{{- $_ = set $labels "app.kubernetes.io/instance" $root.Release.Name -}}
{{- $_ = set $labels "helm.sh/chart" (printf "%s-%s" $root.Chart.Name $root.Chart.Version) -}}
{{- $_ = set $meta "labels" $labels -}}
{{- $_ = set $obj "metadata" $meta -}}
{{- $template := dig "spec" "template" dict $obj -}}
{{- if $template -}}
{{- $tmeta := default dict $template.metadata -}}
{{- $tlabels := default dict $tmeta.labels -}}
{{- $_ = set $tlabels "app.kubernetes.io/part-of" "gpu-admission" -}}
{{- $_ = set $tmeta "labels" $tlabels -}}
{{- $_ = set $template "metadata" $tmeta -}}
{{- $pod := default dict $template.spec -}}
{{- range $container := concat (default list $pod.initContainers) (default list $pod.containers) -}}
{{- if regexMatch "^gpu-admission(:|$)" (toString $container.image) -}}
{{- $_ = set $container "image" (include "gpu-admission.image" $root) -}}
{{- if $root.Values.image.pullPolicy -}}{{- $_ = set $container "imagePullPolicy" $root.Values.image.pullPolicy -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $obj -}}
{{- end -}}

{{/*
Replace the resources of the container named .name in a pod spec when .resources is not empty.
*/}}
{{- define "gpu-admission.resources" -}}
{{- if .resources -}}
{{- range $container := .pod.containers -}}
{{- if eq $container.name $.name -}}{{- $_ := set $container "resources" $.resources -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
