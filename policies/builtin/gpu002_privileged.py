"""GPU002: no container privileged for GPU purposes in a pod that uses GPUs (seed `003_c28dd89f5a652d9c.txt`).

A privileged container sees every device node of the host, so it can use cards the scheduler gave
to others. Privileged for GPU purposes (`podspec.gpu_privilege`) is `securityContext.privileged:
true`, or `capabilities.add` holding SYS_ADMIN or ALL in any spelling the runtimes accept
(`sys_admin`, `CAP_SYS_ADMIN`). The NVIDIA container toolkit itself treats CAP_SYS_ADMIN as
privileged (NVIDIA/nvidia-container-toolkit, cmd/nvidia-container-runtime-hook/container_config.go
`isPrivileged`: CAP_SYS_ADMIN in the bounding set): such a container gets the cards its
NVIDIA_VISIBLE_DEVICES names even where the toolkit is set to ignore that variable in unprivileged
containers, may reconfigure MIG (NVIDIA_MIG_CONFIG_DEVICES), and can mount what the device cgroup
does not stop. Ordinary capabilities (NET_ADMIN, NET_BIND_SERVICE, SYS_PTRACE, CHOWN) pass.

Every container kind counts: init containers, sidecars, regular and ephemeral ones (an ephemeral
container added through `pods/ephemeralcontainers` to a GPU pod is judged here too), in Pods and
workload templates.

"Uses GPUs" means the pod requests a GPU resource in any container, or its nodeSelector or node
affinity asks for GPU-labelled nodes (see nodeaffinity.targets_gpu_nodes), or it claims devices
through Dynamic Resource Allocation (`spec.resourceClaims`, GA and on by default in Kubernetes
1.34; ResourceClaims and ResourceClaimTemplates are namespaced, so a tenant writes them). A claim
names a DeviceClass inside the ResourceClaim or its template, which the pod does not show, and
NVIDIA's DRA driver (`gpu.nvidia.com`) hands out whole cards and MIG devices that way: a
privileged container beside such a claim sees every card of the node, exactly as beside
`nvidia.com/gpu`. Any claim counts, the stricter reading. Privileged pods that
use no GPU are GPU103's business (kept off GPU nodes), and privileged ephemeral containers added
to them later are GPU009's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from policies import applicability, gpu, nodeaffinity, podspec, policy


class PrivilegedOnGpu(policy.ContainerValidator):
    """Refuses privileged containers in pods that request GPUs or target GPU nodes."""

    id = "GPU002"
    summary = "privileged containers are not allowed in pods that use GPUs"

    def relevant(self, context: policy.Context, facts: applicability.Facts) -> bool:
        """Only where a container in scope has a securityContext to be privileged by."""
        del context
        return facts.scope_security_context

    def applies(self, context: policy.Context) -> bool:
        """Only pods that request a GPU or target GPU nodes."""
        spec = context.template.spec
        return gpu.pod_requests_gpu(spec) or nodeaffinity.targets_gpu_nodes(spec) or _claims_devices(spec)

    def check_container(
        self, context: policy.Context, container: podspec.ContainerRef
    ) -> Iterable[policy.Finding]:
        """A finding for a container privileged for GPU purposes."""
        why = podspec.gpu_privilege(container.container)
        if why:
            spec = context.template.spec
            claims = (
                " (the pod claims devices through resourceClaims, which may be GPUs)"
                if not (gpu.pod_requests_gpu(spec) or nodeaffinity.targets_gpu_nodes(spec))
                else ""
            )
            return [
                policy.Finding(
                    detail=f"{container.label} {why}{claims}; drop privileged and SYS_ADMIN/ALL from it, or run "
                    "the privileged part in a pod that requests no GPU"
                )
            ]
        return ()


def _claims_devices(spec: Mapping[str, Any]) -> bool:
    """Whether the pod claims devices through Dynamic Resource Allocation (`spec.resourceClaims`)."""
    return any(isinstance(claim, Mapping) for claim in podspec.sequence(spec.get("resourceClaims")))
