"""GPU101: pin GPU-sharing and topology pods to nodes of the matching `ack.node.gpu.schedule` mode.

Seed `004_79385826ac27146d.txt`: without a node selector a shared-GPU pod may land on a node pool
of the wrong isolation. So: `aliyun.com/gpu-mem` gets the configured shared mode (default `cgpu`,
the one that isolates memory); memory plus `gpu-core.percentage` gets `core_mem`; `aliyun.com/gpu`
gets `topology`. `nvidia.com/gpu` gets nothing: nodes without the label are exclusive too.

The pod's own choice stands: when its nodeSelector or any required affinity term already mentions
the label, nothing is added (GPU005 then judges whether the choice can serve the pod). Adding a
selector beside a user's affinity could contradict it and leave the pod Pending.
"""

from __future__ import annotations

from collections.abc import Mapping

from policies import applicability, gpu, nodeaffinity, patching, policy


class ScheduleMode(policy.PodMutator):
    """Adds nodeSelector ack.node.gpu.schedule for the pod's GPU resource family."""

    id = "GPU101"
    summary = "GPU-sharing and topology pods are pinned to nodes of the matching scheduling mode"

    def relevant(self, context: policy.Context, facts: applicability.Facts) -> bool:
        """Only where some container mentions a GPU resource (no family, nothing to pin)."""
        del context
        return facts.requests_gpu

    def mutate_pod(self, context: policy.Context) -> policy.Mutation:
        """The nodeSelector entry, where the pod has none for the label."""
        spec, path = context.template.spec, context.template.spec_path
        family = gpu.pod_family(spec)
        if family is None:
            return policy.Mutation()
        mode = gpu.injected_mode(family, shared_default=context.settings.default_shared_mode)
        if mode is None or nodeaffinity.constrains(spec, gpu.SCHEDULE_LABEL):
            return policy.Mutation()
        selector = spec.get("nodeSelector")
        if selector is None:
            operation = patching.add(patching.join(path, "nodeSelector"), {gpu.SCHEDULE_LABEL: str(mode)})
        elif isinstance(selector, Mapping):
            operation = patching.add(patching.join(path, "nodeSelector", gpu.SCHEDULE_LABEL), str(mode))
        else:
            return policy.Mutation()
        return policy.Mutation(
            operations=(operation,),
            changes=(f"added nodeSelector {gpu.SCHEDULE_LABEL}={mode} for {family}",),
        )
