"""GPU013: only the scheduler extender lifts the budget gate.

GPU107 creates the pods the device plugin or DRA places in a namespace with a GPU budget behind the
scheduling gate `gpu-admission.io/budget` (`policies.gpu.budgets.GATE`); the extender's gatekeeper
removes it once the pod's charge is in its namespace's ledger. Kubernetes lets anyone who may update
the pod remove a scheduling gate (KEP-3521, Pod Scheduling Readiness: gates are set at creation and
"can be removed in arbitrary order" afterwards, by whoever may write the pod), so a tenant could
lift its own pod past the budget. This policy refuses a pod UPDATE that removes the gate, however it is written (a
`kubectl edit`, a JSON patch `remove` of the entry or of the whole list, a strategic-merge or
merge patch that empties or nulls the list, a PUT of the pod without it): the webhook compares the
stored pod with the new one, so the spelling of the request does not matter. The one requester
allowed is the extender's ServiceAccount (`EXTENDER`, deploy/extender.yaml's ServiceAccount
`gpu-admission-extender` in the namespace `gpu-admission`, which every install uses), matched
exactly against the request's `userInfo.username` as GPU010 matches a scheduler's writers.

Nor can the gate be stepped around by binding the pod: kube-apiserver refuses a Binding of a pod
with any scheduling gate ("pod %v has non-empty .spec.schedulingGates", kubernetes
pkg/registry/core/pod/storage/storage.go `assignPod`), and a pod created with `spec.nodeName` in a
budgeted namespace is GPU107's to refuse.

Updates that keep the gate (labels, annotations, removing another gate) and pods without it pass;
deploy/webhook-configurations.yaml sends a pod's UPDATE here only when the gate was on the stored
pod and is not on the new one. The audit leaves this policy out (`stored_objects`): it judges a
change, not a pod as stored.
"""

from __future__ import annotations

from collections.abc import Iterable

from policies import podspec, policy, schedulers
from policies.builtin import gpu107_budget_gate
from policies.gpu import budgets

# deploy/extender.yaml: the extender's ServiceAccount (a unit test holds the two equal).
EXTENDER = schedulers.ServiceAccount(namespace="gpu-admission", name="gpu-admission-extender")


class BudgetGateKept(policy.Validator):
    """Refuses a pod UPDATE that removes the budget gate, from anyone but the scheduler extender."""

    id = "GPU013"
    summary = "only the scheduler extender lifts the budget gate, once the pod's charge fits its namespace's GPU budget"
    pod_updates = True
    stored_objects = False

    def validate(self, context: policy.Context) -> Iterable[policy.Finding]:
        """A plain pod UPDATE whose stored pod has the gate and whose new pod has not."""
        request = context.request
        if request.operation != "UPDATE" or request.subresource or not context.template.is_pod:
            return ()
        old = podspec.template(request.old_object)
        if old is None or not gpu107_budget_gate.gated(old.spec):
            return ()
        if gpu107_budget_gate.gated(context.template.spec):
            return ()
        if request.user == EXTENDER.username:
            return ()
        return (
            policy.Finding(
                detail=f"the update removes the scheduling gate {budgets.GATE}, which holds the pod until its GPUs "
                f"fit its namespace's GPU budget; the scheduler extender ({EXTENDER}) lifts it then: leave it in place "
                "(`kubectl describe pod` shows the NamespaceBudget events that say what the pod waits for)"
            ),
        )
