"""GPU103: keep pods that ask for no GPU but have node power off GPU nodes (seeds `000_…`, `003_…`).

GPU nodes are a trust zone (`policies.trustzone`): a pod that can reach one may have only what is
known to be safe there (GPU002, GPU003). A pod that asks for no GPU and does not target GPU nodes
may have anything else, a privileged Docker-in-Docker CI runner, an exporter with the container
runtime's socket, a node agent with `hostPID`, a pod with a host port outside the allowlist, because
this policy gives it a required node affinity that every GPU node fails: for each label of
`trustzone.DEFAULT_GPU_NODE_LABELS` and `trustZone.gpuNodeLabels` (ours and ACK's
`aliyun.accelerator/nvidia_name`, the GPU Operator's, GPU Feature Discovery's, Node Feature
Discovery's, GKE's, EKS's, AKS's) `DoesNotExist`, or `NotIn [true]` for the labels that mark a GPU
node only as "true" (seed `000_2d8695719794de07.txt`), added to every required term, and with it
the pod cannot reach a GPU node (the scheduler places by it, and
the kubelet refuses a pod whose node does not match it, `spec.nodeName` or not). The admission
response carries a warning that says why.

"Node power" is whatever GPU002 and GPU003 would refuse on a GPU node in the pod's namespace
(`trustzone.node_power`). With `keepNonGpuPodsOffGpuNodes: true` every pod that asks for no GPU gets
the affinity (note: that includes DaemonSet pods outside the exempt namespaces, which then skip
GPU nodes).

Pods that ask for GPUs, target GPU nodes, tolerate a GPU node taint by key, or run on a node known
to be a GPU node are left alone (`trustzone.Reach.intent`): the affinity would contradict what
they asked for and leave them Pending; their node power is GPU002's and GPU003's to refuse.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from policies import applicability, nodeaffinity, podspec, policy, trustzone

if TYPE_CHECKING:
    from policies.settings import base as settings_


class OffGpuNodes(policy.PodMutator):
    """Adds the keep-off affinity (every GPU node label) to non-GPU pods with node power (optionally: all of them)."""

    id = "GPU103"
    summary = "pods that use no GPU but have node power are kept off GPU nodes"

    def relevant(self, context: policy.Context, facts: applicability.Facts) -> bool:
        """Only pods without GPU resources that have a securityContext, host namespaces, host ports or a volume of an unsafe type."""
        return not facts.requests_gpu and (
            facts.security_context
            or facts.pod_privilege
            or facts.unsafe_volumes
            or facts.host_ports
            or context.settings.keep_non_gpu_pods_off_gpu_nodes
        )

    def mutate_pod(self, context: policy.Context) -> policy.Mutation:
        """The DoesNotExist requirement, where the pod qualifies and lacks it."""
        spec = context.template.spec
        settings = context.settings
        reach = trustzone.reach(spec, settings.trust_zone, node_labels=context.request.node_labels)
        if not reach or reach.intent:
            return policy.Mutation()
        allowance = settings.allowance(context.namespace, context.request.namespace_labels)
        found = trustzone.node_power(spec, podspec.iter_containers(spec, spec_path=context.template.spec_path), allowance)
        if not (found or settings.keep_non_gpu_pods_off_gpu_nodes):
            return policy.Mutation()
        operations = nodeaffinity.require(spec, spec_path=context.template.spec_path, requirements=settings.trust_zone.keep_off)
        if not operations:
            return policy.Mutation()
        if not found:
            return policy.Mutation(operations=tuple(operations), changes=(f"{ADDED} for a pod without GPUs",))
        why = because(found)
        return policy.Mutation(
            operations=tuple(operations),
            changes=(f"{ADDED} for a pod without GPUs: {why}",),
            notices=(notice(found),),
        )


ADDED = "required node affinity against every GPU node label"


def because(found: Sequence[trustzone.Power]) -> str:
    """Why a pod is kept off GPU nodes, in words: its first node power, and how many more it has."""
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return f"{found[0].detail}{more}, which GPU nodes do not allow"


def notice(found: Sequence[trustzone.Power]) -> str:
    """GPU103's notice: the admission warning, and the Event the validating webhook writes."""
    return f"kept off GPU nodes ({ADDED}): {because(found)}"


def kept_off(
    spec: Mapping[str, Any], settings: settings_.Settings, *, namespace: str, namespace_labels: Mapping[str, str] | None
) -> str:
    """GPU103's notice for a stored pod that stays off GPU nodes and has node power; "" otherwise.

    The validating webhook sees the pod with its generated name and uid, so the Event it writes
    with this notice shows in `kubectl describe pod` (the mutating webhook sees neither).
    """
    if not trustzone.stays_off_gpu_nodes(spec, settings.trust_zone):
        return ""
    allowance = settings.allowance(namespace, namespace_labels)
    found = trustzone.node_power(spec, podspec.iter_containers(spec, spec_path=""), allowance)
    return notice(found) if found else ""
