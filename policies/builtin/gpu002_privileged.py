"""GPU002: no privileged container in a pod that uses GPUs (seed `003_c28dd89f5a652d9c.txt`).

A privileged container sees every device node of the host, so it can use cards the scheduler gave
to others. The rule is kept to `securityContext.privileged: true`, as DESIGN states it: added
capabilities such as SYS_ADMIN do not by themselves grant access to `/dev/nvidia*` (the device
cgroup still applies), and refusing them would be a different, broader policy.

"Uses GPUs" means the pod requests a GPU resource in any container, or its nodeSelector or node
affinity asks for GPU-labelled nodes (see nodeaffinity.targets_gpu_nodes). Privileged pods that
use no GPU are GPU103's business: they get kept off GPU nodes instead.
"""

from __future__ import annotations

from collections.abc import Iterable

from policies import gpu, nodeaffinity, podspec, policy


class PrivilegedOnGpu(policy.ContainerValidator):
    """Refuses privileged containers in pods that request GPUs or target GPU nodes."""

    id = "GPU002"
    summary = "privileged containers are not allowed in pods that use GPUs"

    def applies(self, context: policy.Context) -> bool:
        """Only pods that request a GPU or target GPU nodes."""
        spec = context.template.spec
        return gpu.pod_requests_gpu(spec) or nodeaffinity.targets_gpu_nodes(spec)

    def check_container(
        self, context: policy.Context, container: podspec.ContainerRef
    ) -> Iterable[policy.Finding]:
        """A finding for a privileged container."""
        if podspec.is_privileged(container.container):
            return [policy.Finding(detail=f"{container.label} is privileged")]
        return ()
