"""GPU009: no privileged ephemeral container added to a pod that is, or may end up, on a GPU node.

`kubectl debug POD --profile=sysadmin` adds an ephemeral container with
`securityContext.privileged: true` to a running pod through the `pods/ephemeralcontainers`
subresource (an UPDATE; kubernetes/kubectl, pkg/cmd/debug/profiles.go: the sysadmin profile calls
`setPrivileged`, the netadmin profile only adds NET_ADMIN and NET_RAW). GPU103 keeps privileged pods
off GPU nodes when they are created, but it cannot move a pod that already runs: a pod without
GPUs that sits on a GPU node would get a container that can open every card there.

So on that subresource this policy refuses each *newly added* ephemeral container that is
privileged for GPU purposes (`podspec.gpu_privilege`: privileged, or SYS_ADMIN/ALL added) unless the
pod provably stays off GPU nodes:

- bound (`spec.nodeName`) and the Node's labels are known (`model.Request.node_labels`, which the
  webhook looks up with cluster access): allowed only when the node carries no GPU node label
  (`nodeaffinity.is_gpu_node_label`, the one shared definition: our and ACK's labels, and the
  GPU Operator's / NFD's `nvidia.com/gpu.present`, `...pci-10de.present` when "true");
- otherwise (offline dry-run, a failed lookup, or a pod not bound yet, which may still be
  scheduled onto a GPU node): allowed only when every required node-affinity term holds
  `aliyun.accelerator/nvidia_name DoesNotExist`, the affinity GPU103 gives privileged pods.
  Anything else fails closed.

Pods that request GPUs or target GPU nodes are GPU002's: it judges their new ephemeral containers
(with every other container kind), so this policy stands by for them rather than refusing twice.
On CREATE and workload templates it stands by too: GPU002 and GPU103 judge the whole pod there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from policies import gpu, nodeaffinity, podspec, policy

EPHEMERAL_SUBRESOURCE = podspec.EPHEMERAL_SUBRESOURCE
_INSTEAD = (
    "use a debug profile without privilege (kubectl debug --profile=general, baseline or netadmin), "
    "or debug a copy of the pod on a node without GPUs"
)


def stays_off_gpu_nodes(spec: Mapping[str, Any]) -> bool:
    """Whether every required node-affinity term holds `nvidia_name DoesNotExist` (GPU103's affinity)."""
    terms = list(nodeaffinity.required_terms(spec))
    return bool(terms) and all(
        any(
            e.get("key") == gpu.CARD_NAME_LABEL and e.get("operator") == "DoesNotExist"
            for e in nodeaffinity.expressions(term)
        )
        for term in terms
    )


def _gpu_labels(labels: Mapping[str, str]) -> Sequence[str]:
    return sorted(key for key, value in labels.items() if nodeaffinity.is_gpu_node_label(key, value))


def _where(spec: Mapping[str, Any], *, node_labels: Mapping[str, str] | None) -> str:
    """Why the pod is or may be on a GPU node, in words; "" when it provably is not."""
    node = spec.get("nodeName")
    node = node if isinstance(node, str) else ""
    if node and node_labels is not None:
        found = _gpu_labels(node_labels)
        return f"the pod runs on GPU node {node} (label {found[0]})" if found else ""
    if stays_off_gpu_nodes(spec):
        return ""
    if node:
        return (
            f"the pod runs on node {node}, whose labels are not known here, and nothing in the pod "
            f"keeps it off GPU nodes (required affinity {gpu.CARD_NAME_LABEL} DoesNotExist)"
        )
    return "the pod is not bound to a node yet and may be scheduled onto a GPU node"


class EphemeralPrivilege(policy.Validator):
    """Refuses new privileged (or SYS_ADMIN/ALL) ephemeral containers on pods that may sit on GPU nodes."""

    id = "GPU009"
    summary = "privileged ephemeral containers cannot be added to pods on GPU nodes"

    def validate(self, context: policy.Context) -> Iterable[policy.Finding]:
        """A finding per newly added ephemeral container privileged for GPU purposes."""
        if context.whole_pod or context.request.subresource != EPHEMERAL_SUBRESOURCE:
            return ()
        spec = context.template.spec
        if gpu.pod_requests_gpu(spec) or nodeaffinity.targets_gpu_nodes(spec):
            return ()  # GPU002 judges every container of such a pod, the new ephemeral ones included
        privileged = [
            (ref, why)
            for ref in context.containers
            if ref.kind is podspec.ContainerKind.EPHEMERAL and (why := podspec.gpu_privilege(ref.container))
        ]
        if not privileged:
            return ()
        where = _where(spec, node_labels=context.request.node_labels)
        if not where:
            return ()
        return [policy.Finding(detail=f"{ref.label} {why}, and {where}; {_INSTEAD}") for ref, why in privileged]
