"""GPU105: pods using extender-managed GPU resources go to the GPU scheduler (when configured).

Enabled by the setting `gpuSchedulerName`. Pods asking for `aliyun.com/gpu-mem`,
`aliyun.com/gpu-core.percentage` or `aliyun.com/gpu` get `spec.schedulerName` set to it when theirs
is absent, empty or `default-scheduler`. The last must be overridden: the apiserver fills in
`default-scheduler` before admission, so every pod arrives with it. Any other name is the user's
deliberate choice of scheduler and is kept.
"""

from __future__ import annotations

from policies import gpu, patching, podspec, policy, schedulers

DEFAULT_SCHEDULER = schedulers.DEFAULT_SCHEDULER_NAME


class SchedulerName(policy.PodMutator):
    """Sets spec.schedulerName to the GPU scheduler for extender-managed resources."""

    id = "GPU105"
    summary = "pods using extender-managed GPU resources are scheduled by the GPU scheduler"

    def enabled(self, context: policy.Context) -> bool:
        """Only when a GPU scheduler name is configured."""
        return bool(context.settings.gpu_scheduler_name)

    def mutate_pod(self, context: policy.Context) -> policy.Mutation:
        """The schedulerName, where the pod uses extender resources and has no own scheduler."""
        name = context.settings.gpu_scheduler_name
        spec = context.template.spec
        uses_extender = any(
            gpu.container_gpu_resources(ref.container) & gpu.EXTENDER_RESOURCES
            for ref in podspec.iter_containers(spec, spec_path=context.template.spec_path)
        )
        current = spec.get("schedulerName")
        if not name or not uses_extender or current == name:
            return policy.Mutation()
        if current not in (None, "", DEFAULT_SCHEDULER):
            return policy.Mutation()
        return policy.Mutation(
            operations=(patching.add(patching.join(context.template.spec_path, "schedulerName"), name),),
            changes=(f"set schedulerName {name}",),
        )
