"""GPU009: no privileged ephemeral container added to a pod that is, or may end up, on a GPU node.

`kubectl debug POD --profile=sysadmin` adds an ephemeral container with
`securityContext.privileged: true` to a running pod through the `pods/ephemeralcontainers`
subresource (an UPDATE; kubernetes/kubectl, pkg/cmd/debug/profiles.go: the sysadmin profile calls
`setPrivileged`, the netadmin profile only adds NET_ADMIN and NET_RAW). GPU103 keeps privileged pods
off GPU nodes when they are created, but it cannot move a pod that already runs: a pod without
GPUs that sits on a GPU node would get a container that can open every card there.

So on that subresource this policy refuses each *newly added* ephemeral container that has a
privilege GPU nodes do not allow (`trustzone.container_power`, the rule GPU002 applies to the other
containers: privileged, a capability outside the allowlist, `procMount: Unmasked`, ...) unless the
pod provably stays off GPU nodes (`trustzone.reach`):

- bound (`spec.nodeName`) and the Node's labels are known (`model.Request.node_labels`, which the
  webhook looks up with cluster access): allowed only when the node carries no GPU node label
  (`nodeaffinity.is_gpu_node_label`, the one shared definition: our and ACK's labels, and the
  GPU Operator's / NFD's `nvidia.com/gpu.present`, `...pci-10de.present` when "true");
- otherwise (offline dry-run, a failed lookup, or a pod not bound yet, which may still be
  scheduled onto a GPU node): allowed only when every required node-affinity term holds
  `aliyun.accelerator/nvidia_name DoesNotExist`, the affinity GPU103 gives privileged pods.
  Anything else fails closed.

A pod that requests GPUs or targets GPU nodes can reach one, so its new privileged ephemeral
containers are refused whatever its node. GPU002 stands by on this subresource, so nothing is
refused twice; on CREATE and workload templates this policy stands by: GPU002 and GPU103 judge
the whole pod there.
"""

from __future__ import annotations

from collections.abc import Iterable

from policies import podspec, policy, trustzone
from policies.builtin import gpu002_privileged

EPHEMERAL_SUBRESOURCE = podspec.EPHEMERAL_SUBRESOURCE
_INSTEAD = (
    "use a debug profile without privilege (kubectl debug --profile=general or baseline), "
    "or debug a copy of the pod on a node without GPUs"
)


class EphemeralPrivilege(policy.Validator):
    """Refuses new ephemeral containers with privileges GPU nodes do not allow on pods that may sit on GPU nodes."""

    id = "GPU009"
    summary = "privileged ephemeral containers cannot be added to pods on GPU nodes"

    def validate(self, context: policy.Context) -> Iterable[policy.Finding]:
        """A finding per newly added ephemeral container with a privilege GPU nodes do not allow."""
        if context.whole_pod or context.request.subresource != EPHEMERAL_SUBRESOURCE:
            return ()
        return gpu002_privileged.findings(context, trustzone.PRIVILEGE, instead=_INSTEAD)
