"""GPU218: no namespace holds more GPU memory (or more whole cards) than its budget.

A namespace's budget (`gpuBudgets` in the settings, docs/concepts/budgets.md) is kept by the
scheduler extender when it places a pod, so a namespace goes over it when an admin lowers the
budget below what the namespace already holds, when a budget is added to a namespace that already
holds more, or when pods reach cards around the extender (`nodeName`, another scheduler). Nothing
is evicted for it: the extender places no more of the namespace's pods until what it holds drops
below the budget. What is held is counted as the extender counts it (`policies.gpu.budgets.usage`):
every bound pod that has not finished, the namespace's ledger entries of pods not yet seen bound,
and its allocated DRA claims; the failure names the budget, what is used against it and the pods
and claims charged, largest first. Only whole-cluster audits judge budgets (the usage needs every
pod of the namespace, the ledger Leases and the ResourceSlices).
"""

from __future__ import annotations

from policies import model
from policies.gpu import budgets
from webhook.audit import findings
from webhook.audit.checks import base


class NamespaceOverBudget(base.NamespaceCheck):
    """Namespaces that hold more than their GPU budget."""

    id = "GPU218"
    rule = "namespace-over-budget"
    summary = "no namespace holds more GPU memory or whole cards than its budget"
    severity = findings.Severity.MEDIUM
    category = "GPU Resources"
    action = model.Action.WARN

    def check_namespace(self, namespace: findings.ObjectRef, context: base.BudgetContext) -> findings.Finding | None:
        """A failure where the namespace's usage exceeds its budget, else a pass naming both."""
        budget, used = context.budget, context.usage.total
        over: list[str] = []
        if used.memory_mib > budget.memory_mib:
            over.append(f"{budgets.gib(used.memory_mib)} GiB of GPU memory used > {budgets.gib(budget.memory_mib)} GiB")
        if budget.cards is not None and used.cards > budget.cards:
            over.append(f"{used.cards} whole cards used > {budget.cards}")
        if not over:
            return self.finding(
                namespace,
                result=model.Result.PASS,
                detail=f"namespace {namespace.name} holds {used.describe()} of {budget.describe()}",
            )
        charged = sorted(context.usage.by_holder.items(), key=lambda item: (-item[1].memory_mib, -item[1].cards, item[0]))
        holders = [
            f"{ref.kind} {ref.namespace}/{ref.name} {charge.describe()}"
            for key, charge in charged
            for ref in (context.holder(key),)
        ]
        related = [context.holder(key) for key, _ in charged]
        if context.lease is not None:
            related = [context.lease, *related]
        return self.finding(
            namespace,
            result=model.Result.FAIL,
            detail=f"namespace {namespace.name} is over {budget.describe()}: "
            + " and ".join(over)
            + "; charged: "
            + ", ".join(base.shortened(holders)),
            related=related[: base.MAX_RELATED],
        )
