"""GPU012: no MPS client's GPU container sets its own device-memory limit (GPU001's family).

GPU106 gives each `aliyun.com/gpu-mem` container of an MPS pod `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`
from its request, the limit MPS holds in the driver (see GPU106 for NVIDIA's documentation of the
variable). A container's own value would replace it (the pod's `env` is what the container gets),
so in every container GPU106 limits (the `aliyun.com/gpu-mem` containers of pods that may run on
MPS) an allowlist: `env[].value` may be exactly what GPU106 sets for that container and nothing
else; `env[].valueFrom` is refused (a ConfigMap, Secret or field can change before the container
starts). `envFrom` cannot deliver it there: `env` beats `envFrom`, and GPU106 sets it in `env`.
Other containers are not judged: one without a GPU gets no card from the device plugin (and
`NVIDIA_VISIBLE_DEVICES=void`, GPU104), so a memory limit of its own limits nothing; one off MPS
is no MPS client, and the variable does nothing there. That keeps pods without GPU resources
unrefusable, as the validating webhook's `pod-create-not-ordinary` condition assumes
(`policies.ordinary`).
"""

from __future__ import annotations

from collections.abc import Iterable

from policies import applicability, podspec, policy
from policies.builtin import gpu106_mps_memory_limit as gpu106


class MpsMemoryLimitEnv(policy.ContainerValidator):
    """Refuses a container's own CUDA_MPS_PINNED_DEVICE_MEM_LIMIT."""

    id = "GPU012"
    summary = "MPS clients' GPU containers must not set their own device-memory limit (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)"

    def relevant(self, context: policy.Context, facts: applicability.Facts) -> bool:
        """Only where a container in scope asks for a GPU and names the variable in its env."""
        if not facts.requests_gpu:
            return False
        return any(podspec.has_env(ref.container, gpu106.MPS_MEMORY_LIMIT_ENV) for ref in context.containers)

    def check_container(self, context: policy.Context, container: podspec.ContainerRef) -> Iterable[policy.Finding]:
        """A finding for each entry of the variable that is not GPU106's value."""
        expected = gpu106.expected_limit(context, container.container)
        if expected is None:
            return []  # not an MPS client's GPU container: the variable limits nothing there
        found: list[policy.Finding] = []
        for entry in podspec.env_entries(container.container):
            if entry.get("name") != gpu106.MPS_MEMORY_LIMIT_ENV:
                continue
            if "valueFrom" in entry:
                found.append(
                    policy.Finding(
                        detail=f"{container.label} sets {gpu106.MPS_MEMORY_LIMIT_ENV} from valueFrom, which can change after admission; drop it"
                    )
                )
                continue
            value = entry.get("value")
            if value == expected:
                continue
            shown = value if isinstance(value, str) else repr(value)
            found.append(
                policy.Finding(
                    detail=f"{container.label} sets {gpu106.MPS_MEMORY_LIMIT_ENV}={shown}; the webhook sets it to {expected} "
                    "from aliyun.com/gpu-mem: drop it and request the memory instead"
                )
            )
        return found
