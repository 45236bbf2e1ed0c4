"""GPU103: keep privileged pods that use no GPU off GPU nodes (seeds `000_…`, `003_…`).

A privileged container on a GPU node can open every card; if the pod asks for no GPU, the simplest
safe place for it is a node without cards. Privileged means privileged for GPU purposes
(`podspec.gpu_privilege`): `privileged: true`, or SYS_ADMIN or ALL added in any container (init,
sidecar, regular), which the NVIDIA toolkit treats as privileged too (see GPU002). It gets the required node affinity
`aliyun.accelerator/nvidia_name DoesNotExist` from seed `000_2d8695719794de07.txt`, added to every
required term. With `keepNonGpuPodsOffGpuNodes: true` every pod that asks for no GPU gets it (note:
that includes DaemonSet pods outside the exempt namespaces, which then skip GPU nodes).

Pods that target GPU nodes themselves (a nodeSelector or affinity on GPU labels) are left alone:
the added affinity would contradict theirs and leave them Pending; a privileged one is GPU002's to
refuse, a non-privileged one asked for GPU nodes on purpose.
"""

from __future__ import annotations

from policies import applicability, gpu, nodeaffinity, podspec, policy


class OffGpuNodes(policy.PodMutator):
    """Adds nvidia_name DoesNotExist affinity to privileged (optionally: all) non-GPU pods."""

    id = "GPU103"
    summary = "privileged pods that use no GPU are kept off GPU nodes"

    def relevant(self, context: policy.Context, facts: applicability.Facts) -> bool:
        """Only pods without GPU resources that have a securityContext, or all of them under keepNonGpuPodsOffGpuNodes."""
        return not facts.requests_gpu and (facts.security_context or context.settings.keep_non_gpu_pods_off_gpu_nodes)

    def mutate_pod(self, context: policy.Context) -> policy.Mutation:
        """The DoesNotExist requirement, where the pod qualifies and lacks it."""
        spec = context.template.spec
        if gpu.pod_requests_gpu(spec) or nodeaffinity.targets_gpu_nodes(spec):
            return policy.Mutation()
        privileged = any(
            podspec.is_privileged_for_gpus(ref.container)
            for ref in podspec.iter_containers(spec, spec_path=context.template.spec_path)
        )
        if not (privileged or context.settings.keep_non_gpu_pods_off_gpu_nodes):
            return policy.Mutation()
        requirement = nodeaffinity.expression(gpu.CARD_NAME_LABEL, "DoesNotExist")
        operations = nodeaffinity.require(
            spec, spec_path=context.template.spec_path, requirements=[requirement]
        )
        if not operations:
            return policy.Mutation()
        why = "privileged pod" if privileged else "pod"
        return policy.Mutation(
            operations=tuple(operations),
            changes=(f"required node affinity {gpu.CARD_NAME_LABEL} DoesNotExist for a {why} without GPUs",),
        )
