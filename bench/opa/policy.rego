# The reference engine for bench/compare_opa.py: GPU001, GPU002 and GPU004 of gpu-admission
# written in Rego, served by `opa run --server` as a validating admission webhook.
#
# OPA answers `POST /` with the value of its default decision, `data.system.main`, given the
# request body as `input` (the kube-mgmt pattern), so an AdmissionReview in gives an
# AdmissionReview out. Same rules, same messages' policy IDs, same exempt namespaces as the
# built-in defaults; Pods and the pod templates of workloads, as in gpu-admission.
package system

import rego.v1

exempt_namespaces := {"kube-system", "kube-node-lease", "gpu-admission"}

gpu_resources := {
	"nvidia.com/gpu",
	"aliyun.com/gpu-mem",
	"aliyun.com/gpu-count",
	"aliyun.com/gpu-core.percentage",
	"aliyun.com/gpu",
}

family_of := {
	"nvidia.com/gpu": "nvidia.com/gpu",
	"aliyun.com/gpu-mem": "aliyun.com/gpu-mem",
	"aliyun.com/gpu-count": "aliyun.com/gpu-mem",
	"aliyun.com/gpu-core.percentage": "aliyun.com/gpu-mem+aliyun.com/gpu-core.percentage",
	"aliyun.com/gpu": "aliyun.com/gpu",
}

gpu_node_labels := {"ack.node.gpu.schedule", "ack.node.gpu.placement", "gpu-admission.io/gpu-memory-mib"}

positive_operators := {"In", "Exists", "Gt", "Lt"}

container_kinds := ["initContainers", "containers", "ephemeralContainers"]

main := {
	"apiVersion": "admission.k8s.io/v1",
	"kind": "AdmissionReview",
	"response": response,
}

request := input.request

obj := request.object

namespace := request.namespace if request.namespace != ""

else := obj.metadata.namespace if obj.metadata.namespace

else := "default"

# The pod spec of a Pod or of a workload's template.
spec := obj.spec if obj.kind == "Pod"

else := obj.spec.jobTemplate.spec.template.spec if obj.kind == "CronJob"

else := obj.spec.template.spec if obj.kind in {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "ReplicationController"}

evaluated if {
	not namespace in exempt_namespaces
	request.operation == "CREATE"
	spec
}

containers contains [sprintf("%s %q", [kind, c.name]), c] if {
	some kind in container_kinds
	some c in spec[kind]
	is_object(c)
}

# --- GPU001: containers must not choose GPUs through NVIDIA_VISIBLE_DEVICES -----------------------

neutral(value) if lower(trim_space(value)) in {"void", "none"}

visible_entries(c) := [e | some e in c.env; is_object(e); e.name == "NVIDIA_VISIBLE_DEVICES"]

deny contains msg if {
	some [label, c] in containers
	some e in visible_entries(c)
	not e.valueFrom
	value := object.get(e, "value", "")
	not neutral(value)
	msg := sprintf("GPU001: containers must not choose GPUs through NVIDIA_VISIBLE_DEVICES: %s sets NVIDIA_VISIBLE_DEVICES=%v; request GPUs as resources, or use void", [label, value])
}

deny contains msg if {
	some [label, c] in containers
	some e in visible_entries(c)
	e.valueFrom
	not "value" in object.keys(e)
	msg := sprintf("GPU001: containers must not choose GPUs through NVIDIA_VISIBLE_DEVICES: %s sets NVIDIA_VISIBLE_DEVICES through valueFrom, whose value cannot be checked", [label])
}

# envFrom without an explicit env entry may produce the variable: a warning, as offline in gpu-admission.
warn contains msg if {
	some [label, c] in containers
	count(visible_entries(c)) == 0
	some source in c.envFrom
	prefix := object.get(source, "prefix", "")
	startswith("NVIDIA_VISIBLE_DEVICES", prefix)
	some field in ["configMapRef", "secretRef"]
	ref := source[field]
	msg := sprintf("GPU001: containers must not choose GPUs through NVIDIA_VISIBLE_DEVICES: %s takes envFrom %s %q, which may set NVIDIA_VISIBLE_DEVICES; set NVIDIA_VISIBLE_DEVICES=void in env to rule it out", [label, field, object.get(ref, "name", "")])
}

# --- GPU002: privileged containers are not allowed in pods that use GPUs --------------------------

gpu_names(c) := {name |
	some section in ["limits", "requests"]
	some name, _ in c.resources[section]
	name in gpu_resources
}

requests_gpu if {
	some [_, c] in containers
	count(gpu_names(c)) > 0
}

gpu_node_label(key) if key in gpu_node_labels

gpu_node_label(key) if startswith(key, "aliyun.accelerator/")

targets_gpu_nodes if {
	some key, _ in spec.nodeSelector
	gpu_node_label(key)
}

targets_gpu_nodes if {
	some term in spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms
	some expression in term.matchExpressions
	gpu_node_label(expression.key)
	expression.operator in positive_operators
}

targets_gpu_nodes if {
	some item in spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution
	some expression in item.preference.matchExpressions
	gpu_node_label(expression.key)
	expression.operator in positive_operators
}

uses_gpu if requests_gpu

uses_gpu if targets_gpu_nodes

deny contains msg if {
	uses_gpu
	some [label, c] in containers
	c.securityContext.privileged == true
	msg := sprintf("GPU002: privileged containers are not allowed in pods that use GPUs: %s is privileged", [label])
}

# --- GPU004: GPU resources must be positive integers in limits, of one family per pod -------------

quantity(v) := v if {
	is_number(v)
	v == floor(v)
}

quantity(v) := to_number(trim_prefix(trim_space(v), "+")) if {
	is_string(v)
	regex.match(`^\+?[0-9]+$`, trim_space(v))
}

prefix4 := "GPU004: GPU resources must be positive integers in limits, of one family per pod"

deny contains msg if {
	some [label, c] in containers
	some name in gpu_names(c)
	not name in object.keys(object.get(c.resources, "limits", {}))
	msg := sprintf("%s: %s sets %s in requests only; GPU resources belong in limits", [prefix4, label, name])
}

deny contains msg if {
	some [label, c] in containers
	some name in gpu_names(c)
	raw := c.resources.limits[name]
	not positive(raw)
	msg := sprintf("%s: %s sets %s=%v; it must be a positive integer", [prefix4, label, name, raw])
}

positive(raw) if quantity(raw) > 0

deny contains msg if {
	some [label, c] in containers
	some name in gpu_names(c)
	limit := quantity(c.resources.limits[name])
	limit > 0
	raw := c.resources.requests[name]
	not quantity(raw) == limit
	msg := sprintf("%s: %s requests %s=%v but limits it to %v; they must be equal", [prefix4, label, name, raw, limit])
}

deny contains msg if {
	some [label, c] in containers
	limit := quantity(c.resources.limits["aliyun.com/gpu-core.percentage"])
	limit > 100
	msg := sprintf("%s: %s sets aliyun.com/gpu-core.percentage=%v; it must be at most 100", [prefix4, label, limit])
}

deny contains msg if {
	some [label, c] in containers
	names := gpu_names(c)
	not "aliyun.com/gpu-mem" in names
	some needs in ["aliyun.com/gpu-core.percentage", "aliyun.com/gpu-count"]
	needs in names
	msg := sprintf("%s: %s sets %s without aliyun.com/gpu-mem", [prefix4, label, needs])
}

raw_families := {family_of[name] |
	some [_, c] in containers
	some name in gpu_names(c)
}

families := raw_families - {"aliyun.com/gpu-mem"} if "aliyun.com/gpu-mem+aliyun.com/gpu-core.percentage" in raw_families

else := raw_families

deny contains msg if {
	count(families) > 1
	msg := sprintf("%s: pod mixes resource families %s; a node serves only one", [prefix4, concat(" and ", sort(families))])
}

# --- the answer -------------------------------------------------------------------------------------

violations := sort(deny) if evaluated

else := []

warnings := sort(warn) if evaluated

else := []

base := {"uid": request.uid, "allowed": count(violations) == 0}

with_status := object.union(base, {"status": {"code": 403, "message": concat("; ", violations)}}) if count(violations) > 0

else := base

response := object.union(with_status, {"warnings": warnings}) if count(warnings) > 0

else := with_status
