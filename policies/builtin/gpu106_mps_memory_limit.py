"""GPU106: containers of MPS pods get MPS's per-client device-memory limit from their `aliyun.com/gpu-mem`.

On a node of mode `mps` (`ack.node.gpu.schedule=mps`) the pods sharing a card are clients of one
MPS server, and `aliyun.com/gpu-mem` is only a scheduling promise: nothing stops a client from
allocating the whole card. MPS itself can: the client environment variable
`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` limits the device memory a client may allocate, per device, as a
comma list of `<device ordinal>=<amount>` (NVIDIA, Multi-Process Service, "Appendix: Tools and
Interface Reference", section 4.2.7 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT,
https://docs.nvidia.com/deploy/mps/, driver r550 edition; its example `0=1G,1=512MB`). The limit
is a feature of Volta MPS, so it holds on Volta and newer GPUs (compute capability 7.0+); an
allocation beyond it fails with an out-of-memory error in that client only.

What is added: to every container (init, sidecar, regular) that asks for `aliyun.com/gpu-mem` in a
pod served by MPS, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<gpu-mem>G`. The ordinal is 0: a shared pod
gets one card, and the device plugin makes it the only device the container sees. A pod is served
by MPS when its nodeSelector or required node affinity allows only `mps`, or it says nothing about
the mode and GPU101 pins it to `mps` (`defaultSharedMode: mps`). Added only where the container's
`env` does not name the variable; a container that names it with any other value is refused by
GPU012, so what the webhook set is what holds. Applying the patch twice changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies import applicability, gpu, nodeaffinity, patching, podrequests, podspec, policy

MPS_MEMORY_LIMIT_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"


def served_by_mps(spec: Mapping[str, Any], *, shared_default: gpu.Mode) -> bool:
    """Whether the pod runs on an MPS node: the mode its selectors allow, else the one GPU101 pins."""
    constraint = nodeaffinity.mode_constraint(spec)
    if constraint is not None:
        return constraint.allowed == frozenset({str(gpu.Mode.MPS)})
    family = gpu.pod_family(spec)
    return family is not None and gpu.injected_mode(family, shared_default=shared_default) is gpu.Mode.MPS


def expected_limit(context: policy.Context, container: Mapping[str, Any]) -> str | None:
    """The value GPU106 gives this container (`0=<GiB>G`), or None where it gives none."""
    if not served_by_mps(context.template.spec, shared_default=context.settings.default_shared_mode):
        return None
    amounts, _ = podrequests.container_amounts(container, wanted=lambda name: name == gpu.Resource.GPU_MEM.value)
    gib = amounts.get(gpu.Resource.GPU_MEM.value, 0)
    return f"0={gib}G" if gib > 0 else None


class MpsMemoryLimit(policy.ContainerMutator):
    """Adds CUDA_MPS_PINNED_DEVICE_MEM_LIMIT to the gpu-mem containers of MPS pods."""

    id = "GPU106"
    summary = "containers of MPS pods get MPS's device-memory limit from their aliyun.com/gpu-mem"

    def relevant(self, context: policy.Context, facts: applicability.Facts) -> bool:
        """Only where a container in scope asks for aliyun.com/gpu-mem and the pod is served by MPS."""
        if not facts.requests_gpu:
            return False
        if not any(gpu.Resource.GPU_MEM.value in gpu.container_gpu_resources(ref.container) for ref in context.containers):
            return False
        return served_by_mps(context.template.spec, shared_default=context.settings.default_shared_mode)

    def mutate_container(self, context: policy.Context, container: podspec.ContainerRef) -> policy.Mutation:
        """The env entry, where the container asks for gpu-mem on MPS and does not name the variable."""
        value = expected_limit(context, container.container)
        if value is None or podspec.has_env(container.container, MPS_MEMORY_LIMIT_ENV):
            return policy.Mutation()
        entry = {"name": MPS_MEMORY_LIMIT_ENV, "value": value}
        env = container.container.get("env")
        if env is None:
            operation = patching.add(patching.join(container.path, "env"), [entry])
        elif isinstance(env, list):
            operation = patching.add(patching.join(container.path, "env", "-"), entry)
        else:
            return policy.Mutation()
        return policy.Mutation(operations=(operation,), changes=(f"{container.label}: added {MPS_MEMORY_LIMIT_ENV}={value}",))
