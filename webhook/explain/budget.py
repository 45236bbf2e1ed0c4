"""`explain`'s word on the pod's namespace budget (`gpuBudgets`, docs/concepts/budgets.md).

A Pending pod whose namespace has a budget is refused by the scheduler extender's filter, with the
reason NAMESPACE_BUDGET, on every node where its charge (`policies.gpu.budgets`) on top of what
the namespace uses would go over the budget; a pod the device plugin or DRA places waits behind
the scheduling gate `gpu-admission.io/budget` for the same reason. `explain` says so: the budget,
what is used and what the pod asks, on the nodes it refuses, and no preemption there (preemption
never frees a card for a pod whose namespace has no room).

What is used is counted as the audit counts it (`policies.gpu.budgetusage`): the namespace's bound
pods, its ledger Lease's entries and its allocated DRA claims. A pod whose own charge is already
in the ledger (a bind in flight, a gate being lifted) is not refused again.

`explain` never guesses a budget: without a settings file (`--config`) it does not know the
budgets the extender reads, and where the namespace's labels could not be read a budget that
selects namespaces by label cannot be matched; either way the report says the budget was not
judged, and why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from policies import podspec
from policies import settings as settings_
from policies.gpu import budgets, budgetusage, cardrequest, cards, reasons
from policies.settings import budgets as budget_settings
from webhook.explain import analysis

UNLIMITED, FITS, CHARGED, OVER, UNKNOWN = "unlimited", "fits", "charged", "over", "unknown"


@dataclasses.dataclass(frozen=True, kw_only=True)
class BudgetNote:
    """The pod against its namespace's budget."""

    namespace: str
    state: str  # UNLIMITED, FITS, CHARGED (already in the ledger), OVER (refused somewhere) or UNKNOWN
    budget: settings_.Budget | None = None
    used: budgets.Charge = budgets.NOTHING
    asked: budgets.Charge = budgets.NOTHING  # the least the pod would be charged where it would go
    reason: reasons.Reason | None = None  # NAMESPACE_BUDGET where the budget refuses the pod everywhere
    per_node: Mapping[str, reasons.Reason] = dataclasses.field(default_factory=dict)  # the nodes it refuses
    why: str = ""  # UNKNOWN: why the budget could not be judged

    def describe(self) -> str:
        """One sentence for the table."""
        if self.state == UNKNOWN:
            return f"not judged: {self.why}"
        if self.budget is None:
            return f"none: namespace {self.namespace} has no GPU budget (unlimited)"
        head = self.budget.describe()
        if self.state == CHARGED:
            return f"{head}: {self.used.describe()} used, the pod's own charge among it (in the namespace's ledger)"
        if self.reason is not None:
            return f"{reasons.Code.NAMESPACE_BUDGET} {self.reason.message}"
        if self.per_node:
            return (
                f"{head}: {self.used.describe()} used; refuses the pod on {len(self.per_node)} node(s) "
                f"({', '.join(sorted(self.per_node))}), fits elsewhere"
            )
        return f"{head}: {self.used.describe()} used + {self.asked.describe()} asked fits"


def judge(
    pod: Mapping[str, Any],
    *,
    gpu_budgets: Sequence[settings_.Budget] | None,
    namespace_labels: Mapping[str, str] | None,
    pods: Sequence[Mapping[str, Any]],
    nodes: Mapping[str, Mapping[str, Any]],
    candidates: Sequence[str],
    objects: budgetusage.Listed,
    now: float,
    complete: bool = True,
) -> BudgetNote | None:
    """The note on a Pending GPU pod (None for a bound pod, or one that asks for no GPU).

    `gpu_budgets`: None where no settings were read; `namespace_labels`: None where they could not
    be read; `pods`: the cluster's pods (every one where `complete`); `candidates`: the GPU nodes
    the extender would judge the pod on (its placed families)."""
    metadata = podspec.mapping(pod.get("metadata"))
    namespace = str(metadata.get("namespace") or "")
    request = cardrequest.pod_request(pod)
    native = budgets.native_asks(pod)
    if podspec.mapping(pod.get("spec")).get("nodeName") or not (request.managed or native):
        return None
    if gpu_budgets is None:
        return BudgetNote(
            namespace=namespace,
            state=UNKNOWN,
            why="no settings file given (--config FILE): the GPU budgets are the gpuBudgets of the settings the extender reads",
        )
    budget, why = _budget(gpu_budgets, namespace, namespace_labels)
    if why:
        return BudgetNote(namespace=namespace, state=UNKNOWN, why=why)
    if budget is None:
        return BudgetNote(namespace=namespace, state=UNLIMITED)
    own = [p for p in pods if podspec.mapping(p.get("metadata")).get("namespace") == namespace]
    used = budgetusage.namespace_usage(namespace, own, objects, now=now, complete=complete)
    uid = str(metadata.get("uid") or "")
    if uid and uid in used.by_holder:
        return BudgetNote(namespace=namespace, state=CHARGED, budget=budget, used=used.total)
    if request.managed and not request.problem:
        charges = {name: budgets.asked(request, cards.node_cards(nodes[name])) for name in candidates if name in nodes}
    else:
        charge = budgets.gate_charge(pod, nodes.values())
        if charge.problem:
            return BudgetNote(namespace=namespace, state=UNKNOWN, budget=budget, used=used.total, why=charge.problem)
        charges = {"": charge}
    refused = {
        name: reasons.Reason(code=reasons.Code.NAMESPACE_BUDGET, message=f"{budget.describe()}: {over}")
        for name, charge in charges.items()
        if (over := budgets.over(budget.memory_mib, budget.cards, used.total, charge))
    }
    least = min(charges.values(), key=lambda c: (c.memory_mib, c.cards), default=budgets.NOTHING)
    if not refused:
        return BudgetNote(namespace=namespace, state=FITS, budget=budget, used=used.total, asked=least)
    everywhere = len(refused) == len(charges)
    smallest = min(refused, key=lambda name: (charges[name].memory_mib, charges[name].cards, name))
    return BudgetNote(
        namespace=namespace,
        state=OVER,
        budget=budget,
        used=used.total,
        asked=charges[smallest] if everywhere else least,
        reason=refused[smallest] if everywhere else None,
        per_node={name: reason for name, reason in refused.items() if name},
    )


def _budget(
    gpu_budgets: Sequence[settings_.Budget], namespace: str, labels: Mapping[str, str] | None
) -> tuple[settings_.Budget | None, str]:
    """The namespace's budget as the extender finds it (the first entry that selects it), or why it
    cannot be told: a selector to judge on labels that could not be read."""
    for budget in gpu_budgets:
        if budget.match.selector is not None and labels is None:
            if budget.match.names and namespace not in budget.match.names:
                continue
            return None, (
                f"the labels of namespace {namespace} could not be read, and budget {budget.name!r} selects namespaces by label"
            )
        if budget_settings.budget_for((budget,), namespace, labels) is not None:
            return budget, ""
    return None, ""


def applied(report: analysis.Report, note: BudgetNote | None) -> analysis.Report:
    """The report with the note, and NAMESPACE_BUDGET among the reasons of each node it refuses
    (which then does not fit and offers no preemption); the best node judged again."""
    if note is None:
        return report
    if not note.per_node:
        return dataclasses.replace(report, budget=note)
    verdicts = tuple(
        dataclasses.replace(v, fits=False, cards=(), preemption=None, reasons=(*v.reasons, note.per_node[v.node]))
        if v.node in note.per_node
        else v
        for v in report.nodes
    )
    return dataclasses.replace(report, budget=note, nodes=verdicts, suggestion=analysis.suggest(report.request, verdicts))
