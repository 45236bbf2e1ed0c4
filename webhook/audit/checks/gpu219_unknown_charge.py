"""GPU219: every pod and DRA claim of a budgeted namespace has a charge that can be computed.

A namespace's budget counts what each of its pods and claims holds in one unit, GPU memory
(`policies.gpu.budgets`). Some holdings have no memory anyone states: `nvidia.com/gpu` or
`nvidia.com/gpu.shared` on a node whose card memory neither the labeler's inventory, nor its
`gpu-admission.io/gpu-memory-mib` label, nor GPU Feature Discovery's `nvidia.com/gpu.memory` gives;
whole cards of a node that is gone; a DRA device whose ResourceSlice publishes no `memory` capacity.
What is known of such a charge still counts (the whole cards, for instance), but its memory counts
as 0, so the namespace can hold more than its budget says. The failure names what is missing;
label the node (or run the labeler there) or publish the device's memory. Pods and claims of
namespaces without a budget are not judged: nothing is counted against them.
"""

from __future__ import annotations

from policies import model
from webhook.audit import findings
from webhook.audit.checks import base


class UnknownCharge(base.ChargeCheck):
    """Pods and claims of budgeted namespaces whose GPU memory charge cannot be computed."""

    id = "GPU219"
    rule = "unknown-budget-charge"
    summary = "every pod and claim of a budgeted namespace has a GPU memory charge that can be computed"
    severity = findings.Severity.MEDIUM
    category = "GPU Resources"
    action = model.Action.WARN

    def check_charge(self, holder: str, context: base.BudgetContext) -> findings.Finding | None:
        """A failure naming why the charge is not known, else a pass with the charge."""
        ref = context.holder(holder)
        problem = context.usage.problems.get(holder, "")
        charge = context.usage.by_holder.get(holder)
        if problem:
            known = f" (counted: {charge.describe()})" if charge is not None and charge.charged else ""
            return self.finding(
                ref,
                result=model.Result.FAIL,
                detail=f"{ref.kind} {ref.namespace}/{ref.name} in {context.budget.describe()}: {problem}{known}",
            )
        if charge is None:
            return None
        return self.finding(ref, result=model.Result.PASS, detail=f"charged {charge.describe()} to {context.budget.describe()}")
