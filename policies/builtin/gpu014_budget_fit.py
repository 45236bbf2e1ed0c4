"""GPU014: a warning for a pod that alone asks for more than its namespace's GPU budget.

A namespace's budget (`gpuBudgets`) is GPU memory, and optionally whole cards. A pod whose least
possible charge (`policies.gpu.budgets.least_asked`: shares and MIG slices exactly, whole cards as
cards, since their memory depends on the node) is more than the budget on its own can never run
there, however empty the namespace: the extender's filter, or the budget gate (GPU107), keeps it
Pending for ever. Admission says so at once, as a warning that names the budget, and does not
refuse: an admin may raise the budget later. Its default action is `warn`; Pods and workload
templates are judged at create. The audit leaves it out (`stored_objects`): a stored pod may be
running already, admitted under a budget lowered since, and a namespace holding more than its budget
is the budget keeper's to report, not a fault of one pod.
"""

from __future__ import annotations

from collections.abc import Iterable

from policies import model, policy
from policies.gpu import budgets


class BudgetFit(policy.Validator):
    """Warns when the pod's least charge alone is over its namespace's GPU budget."""

    id = "GPU014"
    summary = "a pod must fit its namespace's GPU budget on its own"
    default_action = model.Action.WARN
    stored_objects = False

    def enabled(self, context: policy.Context) -> bool:
        """Only where some namespace has a budget."""
        return bool(context.settings.gpu_budgets)

    def validate(self, context: policy.Context) -> Iterable[policy.Finding]:
        """The finding, where the least the pod could be charged does not fit the budget."""
        if not context.whole_pod:
            return ()
        budget = context.settings.gpu_budget(context.namespace, context.request.namespace_labels)
        if budget is None:
            return ()
        least = budgets.least_asked({"metadata": context.template.metadata, "spec": context.template.spec})
        if not least.charged:
            return ()
        if not budgets.over(budget.memory_mib, budget.cards, budgets.NOTHING, least):
            return ()
        where = "" if context.template.is_pod else "each pod of the template "
        return (
            policy.Finding(
                detail=f"{where}asks for at least {least.describe()}, more than {budget.describe()} allows: it can "
                "never be placed in this namespace, however little the rest of it holds; ask for less or have an "
                "admin raise the budget"
            ),
        )
