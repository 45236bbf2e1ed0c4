"""GPU104: containers that request no GPU get `NVIDIA_VISIBLE_DEVICES=void` (seed `003_…`).

Many CUDA images default the variable to `all`; on a GPU node the NVIDIA runtime would then hand
such a container every card without the scheduler knowing. A GPU is one of the names of the
explicit list (`gpu.is_gpu_resource`) or `trustZone.gpuResources`: a container that asks only for
another extended resource, a NIC of the NVIDIA Network Operator (`nvidia.com/hostdev`,
`nvidia.com/rdma_shared_device_a`) for one, gets `void` too. `void` overrides the image default and,
because `env` takes precedence over `envFrom`, any ConfigMap that might set it. Added only where the
container's `env` does not name the variable at all (a user's own value is GPU001's to judge), to
every container kind present (init, regular, ephemeral).
"""

from __future__ import annotations

from policies import applicability, gpu, patching, podspec, policy


class VoidDevices(policy.ContainerMutator):
    """Adds NVIDIA_VISIBLE_DEVICES=void to containers without GPU resources."""

    id = "GPU104"
    summary = "containers that request no GPU get NVIDIA_VISIBLE_DEVICES=void"

    def relevant(self, context: policy.Context, facts: applicability.Facts) -> bool:
        """Only where a container in scope mentions no GPU resource."""
        del context
        return facts.scope_without_gpu

    def mutate_container(self, context: policy.Context, container: podspec.ContainerRef) -> policy.Mutation:
        """The env entry, where the container requests no GPU and does not name the variable."""
        if context.settings.trust_zone.requests_gpu(container.container):
            return policy.Mutation()
        if podspec.has_env(container.container, gpu.VISIBLE_DEVICES_ENV):
            return policy.Mutation()
        neutral = context.settings.visible_devices_neutral_value
        entry = {"name": gpu.VISIBLE_DEVICES_ENV, "value": neutral}
        operation = patching.add_env(container.path, container.container, entry)
        if operation is None:
            return policy.Mutation()
        return policy.Mutation(
            operations=(operation,),
            changes=(f"{container.label}: added {gpu.VISIBLE_DEVICES_ENV}={neutral}",),
        )
