"""A pod's card-model constraint (GPU102's annotations) and whether one card meets it.

A pod names the cards it may get with three annotations:

- `gpu-admission.io/gpu-model: "Tesla-V100-SXM2-32GB, Tesla T4"`: the card is one of these models
  (each spelled as `aliyun.accelerator/nvidia_name` spells it: spaces become `-`);
- `gpu-admission.io/exclude-gpu-model`: the card is none of these;
- `gpu-admission.io/min-gpu-memory: "16384"` (MiB; `Mi`/`MiB`/`Gi`/`GiB` suffixes accepted): the card
  has at least that much memory.

The constraint is about the card, not the node: on a node with mixed cards (the labeler's inventory
annotation lists each card's model and memory) some cards meet it and others do not. The scheduler
extender judges every card with `Constraint.allows` and places the pod only on a card that meets
it; GPU102 reads the same annotations with `from_annotations` and refuses the ones it cannot read.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from policies import gpu

_MEMORY = re.compile(r"^\s*([0-9]+)\s*(Mi|MiB|Gi|GiB)?\s*$")


def parse_mib(value: str) -> int | None:
    """A memory amount in MiB from `16384`, `16384Mi`, `16Gi`; None when it is not one."""
    match = _MEMORY.match(value)
    if match is None:
        return None
    amount = int(match.group(1))
    return amount * gpu.MIB_PER_GIB if match.group(2) in ("Gi", "GiB") else amount


@dataclasses.dataclass(frozen=True, kw_only=True)
class Constraint:
    """Which cards a pod may get: models (any when empty), excluded models, and a memory floor."""

    models: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()
    min_memory_mib: int = 0
    # Annotations that cannot be read (GPU102 refuses such pods); a constraint with problems meets no card.
    problems: tuple[str, ...] = ()

    @property
    def any(self) -> bool:
        """Whether every card meets it (no annotation asks anything)."""
        return not (self.models or self.excluded or self.min_memory_mib or self.problems)

    def allows(self, *, model: str, memory_mib: int) -> bool:
        """Whether a card of `model` ("" where unknown: it meets no model condition) and `memory_mib` meets it."""
        if self.problems:
            return False
        if (self.models or self.excluded) and not model:
            return False  # a card of unknown model cannot be shown to be, or not to be, a model
        if self.models and model not in self.models:
            return False
        return model not in self.excluded and memory_mib >= self.min_memory_mib

    def describe(self) -> str:
        """The constraint in words, naming the annotations it comes from."""
        if self.problems:
            return "; ".join(self.problems)
        parts: list[str] = []
        if self.models:
            parts.append(f"card model {' or '.join(self.models)} ({gpu.GPU_MODEL_ANNOTATION})")
        if self.excluded:
            parts.append(f"no card model {', '.join(self.excluded)} ({gpu.EXCLUDE_GPU_MODEL_ANNOTATION})")
        if self.min_memory_mib:
            parts.append(f"at least {self.min_memory_mib} MiB per card ({gpu.MIN_GPU_MEMORY_ANNOTATION})")
        return ", ".join(parts) or "any card"


ANY = Constraint()


def from_annotations(annotations: Mapping[str, Any]) -> Constraint:
    """The constraint a pod's (or template's) annotations state; ANY when they state none.

    Never raises: an annotation that cannot be read is a problem (`Constraint.problems`, one line
    each, naming the annotation), which GPU102 reports with its action.
    """
    if not any(key in annotations for key in _KEYS):
        return ANY
    problems: list[str] = []
    models = _models(annotations, gpu.GPU_MODEL_ANNOTATION, problems)
    excluded = _models(annotations, gpu.EXCLUDE_GPU_MODEL_ANNOTATION, problems)
    minimum = annotations.get(gpu.MIN_GPU_MEMORY_ANNOTATION)
    mib = 0
    if minimum is not None:
        parsed = parse_mib(minimum) if isinstance(minimum, str) else None
        if parsed is None or parsed <= 0:
            problems.append(
                f"annotation {gpu.MIN_GPU_MEMORY_ANNOTATION} must be a positive amount of MiB such as 16384, got {minimum!r}"
            )
        else:
            mib = parsed
    if problems:
        return Constraint(problems=tuple(problems))
    return Constraint(models=models, excluded=excluded, min_memory_mib=mib)


_KEYS = (gpu.GPU_MODEL_ANNOTATION, gpu.EXCLUDE_GPU_MODEL_ANNOTATION, gpu.MIN_GPU_MEMORY_ANNOTATION)


def _models(annotations: Mapping[str, Any], key: str, problems: list[str]) -> tuple[str, ...]:
    raw = annotations.get(key)
    if raw is None:
        return ()
    if not isinstance(raw, str):
        problems.append(f"annotation {key} must be a string, got {raw!r}")
        return ()
    models: list[str] = []
    for part in raw.split(","):
        name = gpu.card_name_label_value(part)
        if name and name not in models:
            models.append(name)
    if not models and not problems:
        problems.append(f"annotation {key} names no card model")
    return tuple(models)


def node_requirements(constraint: Constraint) -> Sequence[tuple[str, str, tuple[str, ...]]]:
    """The constraint as node-affinity expressions on the node's summary labels, as (key, operator, values).

    Only right where every card of the node is alike: the labels give the most common model and the
    smallest card (`aliyun.accelerator/nvidia_name`, `gpu-admission.io/gpu-memory-mib`). GPU102 writes
    them for pods whose cards the extender does not pick; see its docstring.
    """
    found: list[tuple[str, str, tuple[str, ...]]] = []
    if constraint.models:
        found.append((gpu.CARD_NAME_LABEL, "In", constraint.models))
    if constraint.excluded:
        found.append((gpu.CARD_NAME_LABEL, "NotIn", constraint.excluded))
    if constraint.min_memory_mib:
        found.append((gpu.CARD_MEMORY_MIB_LABEL, "Gt", (str(constraint.min_memory_mib - 1),)))
    return found
