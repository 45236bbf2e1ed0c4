"""GPU005: the `ack.node.gpu.schedule` a pod selects serves the GPU resource it requests.

A node has one mode and advertises only that mode's resources (seed `002_e2b829a309310c51.txt`),
so a pod asking for `aliyun.com/gpu-mem` but selecting `topology` nodes would stay Pending forever.
The nodeSelector and the required node affinity are read together (terms ORed, expressions and the
nodeSelector ANDed); the pod is refused when no mode they allow serves its resource family. A
broader choice that still includes a serving mode (`In [cgpu, topology]`) is allowed: it can be
scheduled. Pods that ask for no GPU, or for several families (GPU004 refuses those), are not judged.
"""

from __future__ import annotations

from collections.abc import Iterable

from policies import applicability, gpu, nodeaffinity, policy


def _describe(modes: frozenset[str]) -> str:
    named = sorted(mode or "nodes without the label" for mode in modes)
    return ", ".join(named) if named else "no mode"


class ModeAgreement(policy.PodValidator):
    """Refuses GPU pods whose scheduling-mode selector only matches modes that cannot serve them."""

    id = "GPU005"
    summary = "the GPU scheduling mode a pod selects must serve the GPU resource it requests"

    def relevant(self, context: policy.Context, facts: applicability.Facts) -> bool:
        """Only where some container mentions a GPU resource (no family, no finding)."""
        del context
        return facts.requests_gpu

    def check_pod(self, context: policy.Context) -> Iterable[policy.Finding]:
        """A finding when no allowed mode serves the pod's resource family."""
        spec = context.template.spec
        family = gpu.pod_family(spec)
        if family is None:
            return ()
        constraint = nodeaffinity.mode_constraint(spec)
        if constraint is None:
            return ()
        serving: frozenset[str] = frozenset(gpu.modes_for(family))
        if family is gpu.Family.EXCLUSIVE:
            serving |= {nodeaffinity.UNLABELLED}
        if constraint.allowed & serving:
            return ()
        right = ", ".join(gpu.modes_for(family))
        return [
            policy.Finding(
                detail=f"the pod requests {family} but its {constraint.source} allows "
                f"{_describe(constraint.allowed)}; {gpu.SCHEDULE_LABEL} must be one of {right}"
            )
        ]
