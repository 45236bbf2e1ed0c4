"""GPU102: card-model annotations become required node affinity (seed `002_e2b829a309310c51.txt`).

- `gpu-admission.io/gpu-model: "Tesla-V100-SXM2-32GB, Tesla T4"` → `aliyun.accelerator/nvidia_name
  In [...]` (spaces become `-`, as the label spells them);
- `gpu-admission.io/exclude-gpu-model` → `NotIn`;
- `gpu-admission.io/min-gpu-memory: "16384"` (MiB; `Mi`/`MiB`/`Gi`/`GiB` suffixes accepted) →
  `gpu-admission.io/gpu-memory-mib Gt 16383`, i.e. at least the given amount.

Each expression goes into every existing required nodeSelectorTerm (terms are ORed) or a new term.
An annotation that cannot be honoured (not a number, no model named, not a label value) is a
problem reported with the policy's action instead of being ignored: the user asked for a
constraint, and a silent drop would let the pod land on the wrong card.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from policies import gpu, nodeaffinity, policy

_MEMORY = re.compile(r"^\s*([0-9]+)\s*(Mi|MiB|Gi|GiB)?\s*$")


def parse_mib(value: str) -> int | None:
    """A memory amount in MiB from `16384`, `16384Mi`, `16Gi`; None when it is not one."""
    match = _MEMORY.match(value)
    if match is None:
        return None
    amount = int(match.group(1))
    return amount * 1024 if match.group(2) in ("Gi", "GiB") else amount


def _models(
    annotations: Mapping[str, Any], key: str, problems: list[policy.Finding]
) -> list[str]:
    raw = annotations.get(key)
    if raw is None:
        return []
    if not isinstance(raw, str):
        problems.append(policy.Finding(detail=f"annotation {key} must be a string, got {raw!r}"))
        return []
    models: list[str] = []
    for part in raw.split(","):
        name = gpu.card_name_label_value(part)
        if name and name not in models:
            models.append(name)
    if not models and not problems:
        problems.append(policy.Finding(detail=f"annotation {key} names no card model"))
    return models


class CardModel(policy.PodMutator):
    """Turns card-model and minimum-memory annotations into required node affinity."""

    id = "GPU102"
    summary = "card-model annotations become required node affinity"

    def mutate_pod(self, context: policy.Context) -> policy.Mutation:
        """The affinity expressions the annotations ask for, where they are missing."""
        annotations = context.template.annotations
        problems: list[policy.Finding] = []
        requirements: list[dict[str, Any]] = []
        wanted = _models(annotations, gpu.GPU_MODEL_ANNOTATION, problems)
        if wanted:
            requirements.append(nodeaffinity.expression(gpu.CARD_NAME_LABEL, "In", wanted))
        excluded = _models(annotations, gpu.EXCLUDE_GPU_MODEL_ANNOTATION, problems)
        if excluded:
            requirements.append(nodeaffinity.expression(gpu.CARD_NAME_LABEL, "NotIn", excluded))
        minimum = annotations.get(gpu.MIN_GPU_MEMORY_ANNOTATION)
        if minimum is not None:
            mib = parse_mib(minimum) if isinstance(minimum, str) else None
            if mib is None or mib <= 0:
                problems.append(
                    policy.Finding(
                        detail=f"annotation {gpu.MIN_GPU_MEMORY_ANNOTATION} must be a positive "
                        f"amount of MiB such as 16384, got {minimum!r}"
                    )
                )
            else:
                requirements.append(
                    nodeaffinity.expression(gpu.CARD_MEMORY_MIB_LABEL, "Gt", [str(mib - 1)])
                )
        if problems:
            return policy.Mutation(problems=tuple(problems))
        operations = nodeaffinity.require(
            context.template.spec, spec_path=context.template.spec_path, requirements=requirements
        )
        if not operations:
            return policy.Mutation()
        described = "; ".join(
            f"{r['key']} {r['operator']} {', '.join(r['values'])}" for r in requirements
        )
        return policy.Mutation(
            operations=tuple(operations), changes=(f"required node affinity {described}",)
        )
