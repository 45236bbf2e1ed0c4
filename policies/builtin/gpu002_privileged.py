"""GPU002: a pod that can reach a GPU node has only the privileges GPU nodes allow (`policies.trustzone`).

GPU nodes are a trust zone. A pod that can reach one (it requests a GPU resource, claims devices
through Dynamic Resource Allocation, selects, prefers, tolerates its way onto or names a GPU node,
or has nothing that keeps it off GPU nodes: `trustzone.reach`) may have only what is known to be
safe there, and this policy refuses the rest of what a container or the pod can do to the node:

- a privileged container (it sees every device node of the host, every card among them);
- any added capability outside the allowlist: Pod Security `baseline`'s set plus `IPC_LOCK`,
  `SYS_NICE`, `SYS_RESOURCE` and `SYS_PTRACE` (not with `hostPID`), each with its reason in
  `trustzone.GPU_WORKLOAD_CAPABILITIES`, and what the settings add (`trustZone.allow.capabilities`,
  per namespace in `trustZone.namespaces`). So `SYS_ADMIN` and `ALL` (which the NVIDIA toolkit
  treats as privileged: NVIDIA/nvidia-container-toolkit, container_config.go `isPrivileged`),
  `SYS_MODULE`, `DAC_READ_SEARCH` (`open_by_handle_at`), `SYS_RAWIO`, `BPF`, `PERFMON`,
  `SYS_BOOT`, `SYS_TIME`, `NET_ADMIN` (nf_tables, the kernel code behind most recent container
  escapes), `NET_RAW`, ... are refused whatever the seccomp profile, in any spelling the
  runtimes accept (`sys_module`, `CAP_SYS_MODULE`), and so is any name nobody has thought of yet;
- a host port outside the allowlist (`trustzone.DEFAULT_HOST_PORTS`, `trustZone.hostPorts`): the CNI
  portmap plugin hands the node's port to the pod, so `hostPort: 10250` takes the kubelet's API
  (exec, attach, logs of every pod there) and 9100 or 9400 the node's metrics; the built-in ranges
  leave out every port a node daemon or one of our components listens on;
- `hostNetwork`, `hostPID`, `hostIPC` (unless a namespace's allowance names them, for MPS or NCCL
  jobs), `procMount: Unmasked`, SELinux options beyond `baseline`'s types, Windows host processes.

Every container kind counts: init containers, sidecars, regular and ephemeral ones, in Pods and
workload templates (an ephemeral container added later through `pods/ephemeralcontainers` is
GPU009's, by the same rule). A pod that asks for no GPU and does not target GPU nodes is not refused for any of this:
GPU103 keeps it off GPU nodes, and then it cannot reach one. GPU103 acting anything but `enforce`
leaves such a pod able to reach a GPU node, and then it is judged here like any other.
"""

from __future__ import annotations

from collections.abc import Iterable

from policies import applicability, policy, trustzone


def reach(context: policy.Context) -> trustzone.Reach:
    """Whether the pod in `context` can reach a GPU node (the request's node labels where known)."""
    return trustzone.reach(context.template.spec, context.settings.trust_zone, node_labels=context.request.node_labels)


def power(context: policy.Context, kind: str) -> list[trustzone.Power]:
    """What the pod in `context` has of `kind` that GPU nodes do not allow in its namespace."""
    allowance = context.settings.allowance(context.namespace, context.request.namespace_labels)
    found = trustzone.node_power(
        context.template.spec,
        context.containers,
        allowance,
        whole_pod=context.whole_pod,
        rules=context.settings.host_paths,
    )
    return [p for p in found if p.kind == kind]


def findings(context: policy.Context, kind: str, *, instead: str) -> list[policy.Finding]:
    """The findings of GPU002 (`kind` privilege) or GPU003 (volume): what the pod has, and why it is judged."""
    why = reach(context)  # cheaper than the power, and most pods that have power stay off GPU nodes
    if not why:
        return []
    found = power(context, kind)
    return [policy.Finding(detail=f"{item.detail}; {why.why}; {instead}") for item in found]


class PrivilegedOnGpu(policy.Validator):
    """Refuses privileges GPU nodes do not allow in pods that can reach a GPU node."""

    id = "GPU002"
    summary = "a pod that can reach a GPU node may have only the privileges GPU nodes allow"

    def relevant(self, context: policy.Context, facts: applicability.Facts) -> bool:
        """Only where a container in scope has a securityContext or a host port, or the pod host namespaces or security options."""
        del context
        return facts.scope_security_context or facts.pod_privilege or facts.scope_host_ports

    def validate(self, context: policy.Context) -> Iterable[policy.Finding]:
        """A finding per privilege the pod has and GPU nodes do not allow (GPU009 judges ephemeral containers added later)."""
        if not context.whole_pod:
            return ()
        return findings(
            context,
            trustzone.PRIVILEGE,
            instead="drop it, run the privileged part in a pod that asks for no GPU (it is kept off GPU nodes), "
            "or ask an admin to allow it for the namespace (trustZone)",
        )
