"""`gpuBudgets`: how much GPU memory (and, optionally, how many whole cards) each namespace may hold.

One entry gives every namespace it selects a budget of its own (not one budget shared by them); the
first entry that matches a namespace decides, and a namespace no entry matches is unlimited. The
namespaces are named as exceptions name theirs, and anchored the same way (names, or a selector
with a positive requirement): a selector a tenant could satisfy or escape by labelling would let a
tenant choose its own budget.

What a pod is charged, whatever it asks for (whole cards, MIG slices, shares, DRA claims), is
`policies.gpu.budgets`'; the scheduler extender keeps the budgets (docs/concepts/budgets.md).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from policies.gpu import quantity
from policies.settings import selection, shapes

MIB = 1024 * 1024
# A number and nothing else (`160`, `1.5`, `+160`): bytes to Kubernetes, a slip for GiB to the admin.
_BARE_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Budget:
    """`gpuBudgets`: what each namespace `match` selects may hold at once."""

    name: str
    match: selection.NamespaceMatch
    memory_mib: int  # GPU memory, in MiB (the unit of the cards' inventory)
    cards: int | None = None  # whole cards (aliyun.com/gpu, nvidia.com/gpu); None: not limited
    memory_text: str = ""  # as written, for messages

    def describe(self) -> str:
        cards = "" if self.cards is None else f" and {self.cards} whole card{'s' if self.cards != 1 else ''}"
        return f"budget {self.name!r} ({self.memory_text or f'{self.memory_mib}Mi'} of GPU memory{cards})"


def budgets_of(data: Mapping[str, Any] | None) -> tuple[Budget, ...]:
    """Only the `gpuBudgets` of a settings document (what the scheduler extender reads of the same
    file; the rest is the webhook's and may name user policies the extender does not load)."""
    if data is not None and not isinstance(data, Mapping):
        raise shapes.InvalidSettings(f"settings: must be a mapping, got {type(data).__name__}")
    return budgets((data or {}).get("gpuBudgets"))


def budgets(value: object) -> tuple[Budget, ...]:
    if value is None:
        return ()
    found: list[Budget] = []
    known = ("name", "namespaces", "namespaceSelector", "memory", "cards")
    names: set[str] = set()
    for field, entry in shapes.entries(value, field="gpuBudgets", known=known):
        name, match = selection.anchored_entry(entry, field=field)
        if name in names:
            raise shapes.InvalidSettings(f"{field}.name: {name!r} is given twice; budget names must be unique")
        names.add(name)
        if "memory" not in entry:
            raise shapes.InvalidSettings(f"{field}.memory: required (GPU memory as a quantity, e.g. 160Gi)")
        memory_mib, text = memory(entry["memory"], field=f"{field}.memory")
        cards = entry.get("cards")
        if cards is not None and (not isinstance(cards, int) or isinstance(cards, bool) or cards < 0):
            raise shapes.InvalidSettings(f"{field}.cards: must be a whole number of cards >= 0, got {cards!r}")
        found.append(Budget(name=name, match=match, memory_mib=memory_mib, cards=cards, memory_text=text))
    return tuple(found)


def memory(value: object, *, field: str) -> tuple[int, str]:
    """A GPU-memory quantity in whole MiB (rounded down) and as written; refused naming `field`."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise shapes.InvalidSettings(f"{field}: must be a quantity of bytes such as 160Gi or 40960Mi, got {value!r}")
    found = quantity.decoded(value)
    if found is None:
        raise shapes.InvalidSettings(f"{field}: {value!r} is not a quantity; write e.g. 160Gi or 40960Mi")
    if found.sign < 0:
        raise shapes.InvalidSettings(f"{field}: must not be negative, got {value!r}")
    if isinstance(value, int) or _BARE_NUMBER.fullmatch(value.strip()):
        raise shapes.InvalidSettings(
            f"{field}: {value!r} has no unit and would be bytes; write the unit, e.g. {value}Gi or {value}Mi"
        )
    return int(found.fraction()) // MIB, str(value)


def budget_for(budgets_: tuple[Budget, ...], namespace: str, labels: Mapping[str, str] | None) -> Budget | None:
    """The budget of a namespace: the first entry that selects it; None where none does (unlimited)."""
    if not budgets_:
        return None
    seen = selection.labels_of_namespace(namespace, labels)
    for budget in budgets_:
        if budget.match.matches(namespace, seen):
            return budget
    return None
