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
pod that may run on an MPS node, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<gpu-mem>G`. The ordinal is 0:
a shared pod gets one card, and the device plugin makes it the only device the container sees. A
pod may run on an MPS node when its nodeSelector and required node affinity allow `mps` (alone or
among other modes: an affinity listing `mps` and `cgpu` must not be a way round the limit), or
they say nothing about the mode and either GPU101 pins it to `mps` (`defaultSharedMode: mps`) or
GPU101 is not enforced in its namespace (nothing then keeps it off MPS nodes). Elsewhere the
variable would do nothing: only an MPS client reads it. Added only where the container's
`env` does not name the variable; a container that names it with any other value is refused by
GPU012, so what the webhook set is what holds. Applying the patch twice changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies import applicability, gpu, model, nodeaffinity, patching, podspec, policy
from policies.gpu import podrequests

MPS_MEMORY_LIMIT_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"


SCHEDULE_MODE_POLICY = "GPU101"  # what pins a pod without a mode of its own


def may_run_on_mps(context: policy.Context) -> bool:
    """Whether the pod may run on an MPS node (see the module docstring)."""
    spec = context.template.spec
    constraint = nodeaffinity.mode_constraint(spec)
    if constraint is not None:
        return str(gpu.Mode.MPS) in constraint.allowed
    family = gpu.pod_family(spec)
    if family is None or gpu.Mode.MPS not in gpu.modes_for(family):
        return False
    if gpu.injected_mode(family, shared_default=context.settings.default_shared_mode) is gpu.Mode.MPS:
        return True
    pinning = context.settings.action(
        SCHEDULE_MODE_POLICY, namespace=context.namespace, namespace_labels=context.request.namespace_labels
    )
    return pinning is not model.Action.ENFORCE


def expected_limit(context: policy.Context, container: Mapping[str, Any]) -> str | None:
    """The value GPU106 gives this container (`0=<GiB>G`), or None where it gives none."""
    if not may_run_on_mps(context):
        return None
    amounts, _ = podrequests.container_amounts(container, wanted=lambda name: name == gpu.Resource.GPU_MEM.value)
    gib = amounts.get(gpu.Resource.GPU_MEM.value, 0)
    return f"0={gib}G" if gib > 0 else None


class MpsMemoryLimit(policy.ContainerMutator):
    """Adds CUDA_MPS_PINNED_DEVICE_MEM_LIMIT to the gpu-mem containers of MPS pods."""

    id = "GPU106"
    summary = "containers of MPS pods get MPS's device-memory limit from their aliyun.com/gpu-mem"

    def relevant(self, context: policy.Context, facts: applicability.Facts) -> bool:
        """Only where a container in scope asks for aliyun.com/gpu-mem and the pod may run on MPS."""
        if not facts.requests_gpu:
            return False
        if not any(gpu.Resource.GPU_MEM.value in gpu.container_gpu_resources(ref.container) for ref in context.containers):
            return False
        return may_run_on_mps(context)

    def mutate_container(self, context: policy.Context, container: podspec.ContainerRef) -> policy.Mutation:
        """The env entry, where the container asks for gpu-mem on MPS and does not name the variable."""
        value = expected_limit(context, container.container)
        if value is None or podspec.has_env(container.container, MPS_MEMORY_LIMIT_ENV):
            return policy.Mutation()
        entry = {"name": MPS_MEMORY_LIMIT_ENV, "value": value}
        operation = patching.add_env(container.path, container.container, entry)
        if operation is None:
            return policy.Mutation()
        return policy.Mutation(operations=(operation,), changes=(f"{container.label}: added {MPS_MEMORY_LIMIT_ENV}={value}",))
