"""GPU012: no container sets its own MPS device-memory limit (GPU001's family).

GPU106 gives each `aliyun.com/gpu-mem` container of an MPS pod `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`
from its request, the limit MPS holds in the driver (see GPU106 for NVIDIA's documentation of the
variable). A container's own value would replace it (the pod's `env` is what the container gets),
so an allowlist: `env[].value` may be exactly what GPU106 sets for that container and nothing else
(containers GPU106 gives no limit may not name the variable at all: without MPS it does nothing,
on MPS it would be a limit of the tenant's choosing); `env[].valueFrom` is refused always (a
ConfigMap, Secret or field can change before the container starts). `envFrom` cannot deliver it
where it matters: `env` beats `envFrom`, and GPU106 sets it in `env` of every container it limits.
Every container kind is judged (init, sidecar, regular, ephemeral).
"""

from __future__ import annotations

from collections.abc import Iterable

from policies import applicability, podspec, policy
from policies.builtin import gpu106_mps_memory_limit as gpu106


class MpsMemoryLimitEnv(policy.ContainerValidator):
    """Refuses a container's own CUDA_MPS_PINNED_DEVICE_MEM_LIMIT."""

    id = "GPU012"
    summary = "containers must not set their own MPS device-memory limit (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)"

    def relevant(self, context: policy.Context, facts: applicability.Facts) -> bool:
        """Only where a container in scope names the variable in its env."""
        del facts
        return any(podspec.has_env(ref.container, gpu106.MPS_MEMORY_LIMIT_ENV) for ref in context.containers)

    def check_container(self, context: policy.Context, container: podspec.ContainerRef) -> Iterable[policy.Finding]:
        """A finding for each entry of the variable that is not GPU106's value."""
        expected = gpu106.expected_limit(context, container.container)
        found: list[policy.Finding] = []
        for entry in podspec.env_entries(container.container):
            if entry.get("name") != gpu106.MPS_MEMORY_LIMIT_ENV:
                continue
            if "valueFrom" in entry:
                found.append(policy.Finding(
                    detail=f"{container.label} sets {gpu106.MPS_MEMORY_LIMIT_ENV} from valueFrom, which can change after admission; drop it"
                ))
                continue
            value = entry.get("value")
            if expected is not None and value == expected:
                continue
            shown = value if isinstance(value, str) else repr(value)
            want = f"the webhook sets it to {expected} from aliyun.com/gpu-mem" if expected is not None else "the webhook sets it for MPS pods from aliyun.com/gpu-mem"
            found.append(policy.Finding(
                detail=f"{container.label} sets {gpu106.MPS_MEMORY_LIMIT_ENV}={shown}; {want}: drop it and request the memory instead"
            ))
        return found
