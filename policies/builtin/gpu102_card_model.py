"""GPU102: card-model annotations constrain the card a pod gets (seed `002_e2b829a309310c51.txt`).

The annotations (`policies.gpu.cardmodel`): `gpu-admission.io/gpu-model: "Tesla-V100-SXM2-32GB, Tesla T4"`
(the card is one of these; spaces become `-`, as the label spells them), `gpu-admission.io/exclude-gpu-model`
(none of these), `gpu-admission.io/min-gpu-memory: "16384"` (at least that many MiB; `Mi`/`MiB`/`Gi`/`GiB`
suffixes accepted).

They are about the card, and who picks the card decides how they are kept:

- Pods whose cards the scheduler extender picks (`aliyun.com/gpu-mem`, `aliyun.com/gpu-core.percentage`,
  `aliyun.com/gpu`): nothing is added to the pod. The extender reads the annotations and judges each
  card of each node (`cardmodel.Constraint.refusal`, per card from the labeler's inventory), so
  filter, prioritize and bind only ever offer a card that meets them. Node affinity would be wrong
  here: the node labels summarise the node (`aliyun.accelerator/nvidia_name` is the most common
  model, `gpu-admission.io/gpu-memory-mib` the smallest card), so on a node with 2 x 16 GB and
  2 x 32 GB cards `min-gpu-memory: 20Gi` would exclude the node although two cards qualify, and
  `gpu-model` of the 16 GB card would let the pod onto a 32 GB one.
- Every other pod (`nvidia.com/gpu`, whose card the device plugin picks, or no GPU at all): the
  constraint becomes required node affinity, the only place it can be kept:
  `aliyun.accelerator/nvidia_name In [...]` / `NotIn [...]` and `gpu-admission.io/gpu-memory-mib Gt
  <MiB - 1>`, i.e. at least the given amount. Each expression goes into every existing required
  nodeSelectorTerm (terms are ORed) or a new term. On a mixed node this is as good as the labels:
  the memory floor holds for every card (the label is the smallest), the model for the most common one.

An annotation that cannot be honoured (not a string, not a positive amount, no model named) is a
problem reported with the policy's action instead of being ignored, for every pod: the user asked
for a constraint, and a silent drop would let the pod land on the wrong card.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies import applicability, gpu, nodeaffinity, policy
from policies.gpu import cardmodel

# The families whose every card the extender picks; a pod asking only these gets no node affinity.
_EXTENDER_FAMILIES = frozenset({gpu.Family.SHARED, gpu.Family.SHARED_CORE, gpu.Family.TOPOLOGY})


class CardModel(policy.PodMutator):
    """Refuses unreadable card-model annotations; pins pods the extender does not place to matching nodes."""

    id = "GPU102"
    summary = "card-model annotations constrain the card a pod gets"

    def relevant(self, context: policy.Context, facts: applicability.Facts) -> bool:
        """Only where the pod has annotations (without a card-model one it asks for any card)."""
        del context
        return facts.annotations

    def mutate_pod(self, context: policy.Context) -> policy.Mutation:
        """The problems of the annotations, or the affinity expressions they ask for, where missing."""
        constraint = cardmodel.from_annotations(context.template.annotations)
        if constraint.problems:
            return policy.Mutation(problems=tuple(policy.Finding(detail=p) for p in constraint.problems))
        if constraint.any or placed_by_extender(context.template.spec):
            return policy.Mutation()
        requirements = [
            nodeaffinity.expression(key, operator, list(values))
            for key, operator, values in cardmodel.node_requirements(constraint)
        ]
        operations = nodeaffinity.require(context.template.spec, spec_path=context.template.spec_path, requirements=requirements)
        if not operations:
            return policy.Mutation()
        described = "; ".join(f"{r['key']} {r['operator']} {', '.join(r['values'])}" for r in requirements)
        return policy.Mutation(operations=tuple(operations), changes=(f"required node affinity {described}",))


def placed_by_extender(spec: Mapping[str, Any]) -> bool:
    """Whether the scheduler extender picks every card the pod spec gets (and so keeps the constraint itself)."""
    families = gpu.pod_families(spec)
    return bool(families) and families <= _EXTENDER_FAMILIES
