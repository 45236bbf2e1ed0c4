"""GPU107: pods the device plugin or DRA places in a namespace with a GPU budget wait at the budget gate.

A namespace's GPU-memory budget (`gpuBudgets`, `policies.settings.budgets`) is kept by the scheduler
extender when it places a pod (`aliyun.com/gpu-mem`, `gpu-core.percentage`, `aliyun.com/gpu`). A pod
asking for `nvidia.com/gpu`, `nvidia.com/gpu.shared` or a MIG slice (`nvidia.com/mig-*`), or holding
DRA ResourceClaims (`spec.resourceClaims`), is placed by kube-scheduler and the device plugin or the
DRA driver without ever asking the extender, so the extender cannot turn it away. Such a pod is
created behind a scheduling gate instead: this policy appends `{"name": "gpu-admission.io/budget"}`
(`policies.gpu.budgets.GATE`) to its `spec.schedulingGates`, creating the list where there is none,
and the extender's gatekeeper (`webhook.extender.gates`) removes it once the pod's charge is in its
namespace's ledger (or at once where the namespace has no budget any more).

Scheduling gates are Kubernetes' own (KEP-3521, Pod Scheduling Readiness, stable in v1.30): a pod
with a non-empty `spec.schedulingGates` stays `SchedulingGated` and no scheduler considers it; the
field "can only be set at pod creation time, and be removed only afterwards" (the PodSpec API
reference; kubernetes.io/docs/concepts/scheduling-eviction/pod-scheduling-readiness), so the gate is
added at CREATE only, never on an UPDATE. Kueue keeps plain pods the same way
(kubernetes-sigs/kueue, pkg/controller/jobs/pod/pod_webhook.go `Default` gates a pod at create with
`kueue.x-k8s.io/admission`, pkg/controller/jobs/pod/constants/constants.go; pkg/util/pod/pod.go
`Gate` appends the gate unless present, `Ungate` removes it by its index).

Only Pods are gated: a workload's pod template is left alone (its pods are gated when they are
created, each with its own charge), and a pod already behind the gate is not gated twice. A pod that
names its node (`spec.nodeName`) skips the scheduler and so the gate, and the apiserver refuses a pod
with both ("spec.nodeName: Forbidden: cannot be set until all schedulingGates have been cleared",
kubernetes pkg/apis/core/validation ValidatePodCreate): such a pod in a budgeted namespace is
refused here with a message that says why (it would hold GPUs outside its namespace's budget).
GPU013 keeps the gate on until the extender lifts it; GPU014 warns about a pod that can never fit.
In front of another GPU scheduler (the `scheduler` setting) the three are off: only this project's
extender lifts the gate, and a gated pod would otherwise wait for ever.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies import patching, podspec, policy
from policies.gpu import budgets

SCHEDULING_GATES = "schedulingGates"


def gated(spec: Mapping[str, Any]) -> bool:
    """Whether the pod spec carries the budget gate."""
    return budgets.gate_index(spec) is not None


def placed_without_extender(spec: Mapping[str, Any]) -> str:
    """What of the pod the device plugin or DRA places (in words), "" for nothing."""
    asks = budgets.native_asks({"spec": spec})
    parts = [f"{name}: {count}" for name, count in sorted(asks.items())]
    if podspec.sequence(spec.get("resourceClaims")):
        parts.append("DRA resourceClaims")
    return ", ".join(parts)


class BudgetGate(policy.PodMutator):
    """Adds the budget scheduling gate to device-plugin and DRA pods in namespaces with a GPU budget."""

    id = "GPU107"
    summary = "pods the device plugin or DRA places in a namespace with a GPU budget wait at the budget gate"

    def enabled(self, context: policy.Context) -> bool:
        """Only where some namespace has a budget."""
        return bool(context.settings.gpu_budgets)

    def mutate_pod(self, context: policy.Context) -> policy.Mutation:
        """The gate, on a Pod CREATE in a budgeted namespace asking for what the extender does not place."""
        template = context.template
        if not template.is_pod or context.request.operation != "CREATE":
            return policy.Mutation()
        spec = template.spec
        what = placed_without_extender(spec)
        if not what or gated(spec):
            return policy.Mutation()
        labels = context.request.namespace_labels
        budget = context.settings.gpu_budget(context.namespace, labels)
        unknown = budget is None and labels is None and not spec.get("nodeName")
        if unknown and any(b.match.selector is not None for b in context.settings.gpu_budgets):
            # The namespace's labels are not known here (no cluster access, a namespace too new for
            # the webhook's cache), and a budget chooses namespaces by label: gate it, the safe side.
            # Where it has no budget, the extender lifts the gate without a charge at once.
            guessed = next(b for b in context.settings.gpu_budgets if b.match.selector is not None)
            return self._gate(
                context,
                spec,
                what=what,
                why=f"the namespace's labels are unknown here, and {guessed.describe()} chooses by label",
            )
        if budget is None:
            return policy.Mutation()
        if spec.get("nodeName") not in (None, ""):
            return policy.Mutation(
                problems=(
                    policy.Finding(
                        detail=f"spec.nodeName is {spec['nodeName']!r} while the pod asks for {what} in a namespace "
                        f"with {budget.describe()}: a pod that names its node skips the scheduler and the budget gate, "
                        "so its GPUs would not be counted; remove nodeName and pick the node with a nodeSelector "
                        "(kubernetes.io/hostname) instead"
                    ),
                )
            )
        return self._gate(context, spec, what=what, why=budget.describe())

    @staticmethod
    def _gate(context: policy.Context, spec: Mapping[str, Any], *, what: str, why: str) -> policy.Mutation:
        template = context.template
        gates = spec.get(SCHEDULING_GATES)
        entry = {"name": budgets.GATE}
        if gates is None:
            operation = patching.add(patching.join(template.spec_path, SCHEDULING_GATES), [entry])
        elif isinstance(gates, list):
            operation = patching.add(patching.join(template.spec_path, SCHEDULING_GATES, "-"), entry)
        else:
            return policy.Mutation()  # not a list: the apiserver refuses the pod anyway
        return policy.Mutation(
            operations=(operation,),
            changes=(f"added scheduling gate {budgets.GATE} ({what}; {why})",),
        )
