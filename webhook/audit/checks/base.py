"""The shape of an audit check: its identity, how it words a result, and one base class per kind of object it judges.

A check is a stateless class with six class attributes: a stable `id` (continuing the built-in
policies' numbering), a `rule` name, a one-sentence `summary` used verbatim in failure messages, a
`severity`, a `category` and a fixed `action` (the settings file only knows admission policies).
It judges one kind of object through that kind's method and returns a `findings.Finding` (pass
included), or None where it does not apply:

| base | judges | method | context |
|---|---|---|---|
| `TemplateCheck` | a Pod or a workload, by its pod template as written | `check_template(obj)` | none |
| `PodCheck` | a Pod as it runs: bound, allocated, using cards | `check_pod(pod, context)` | `PodContext` |
| `NodeCheck` | a GPU node and its cards | `check_node(node, context)` | `NodeContext` |
| `EnvSourceCheck` | a ConfigMap or Secret, keys only | `check_source(source, context)` | `EnvSourceContext` |
| `ExceptionCheck` | an exception in the settings file | `check_exception(exception, now=...)` | the time |
| `NamespaceCheck` | a namespace with a GPU budget (`gpuBudgets`) | `check_namespace(namespace, context)` | `BudgetContext` |
| `ChargeCheck` | a pod or DRA claim charged to a budgeted namespace | `check_charge(holder, context)` | `BudgetContext` |

A check that judges two kinds derives from both bases (GPU203 judges pods and nodes). The contexts
hold what the scan computes once for the whole audit (every node by name, a node's card state,
every pod by UID), so a check never lists anything itself. Checks are pure: decoded objects in, a
finding out; they read the GPU model from `policies` and never another check's module.
"""

from __future__ import annotations

import abc
import dataclasses
import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

from policies import model, settings, trustzone
from policies.gpu import allocation, budgets, cards, podparse, reservations
from webhook.audit import findings
from webhook.audit.checks import facts

# A card or node shared by thousands of pods must not make a message or a report result huge
# (reports live in etcd): name this many pods, then say how many more there are.
MAX_NAMED = 10
MAX_RELATED = 50


class Check(abc.ABC):
    """A consistency check: stable ID, rule name, one-sentence summary, severity, category, action."""

    id: ClassVar[str]
    rule: ClassVar[str]
    summary: ClassVar[str]
    severity: ClassVar[findings.Severity]
    category: ClassVar[str]
    action: ClassVar[model.Action]

    def finding(
        self,
        subject: findings.ObjectRef,
        *,
        result: model.Result,
        detail: str = "",
        related: Iterable[findings.ObjectRef] = (),
    ) -> findings.Finding:
        """A result of this check; failures get the message `"<id>: <summary>: <detail>"`.

        A `warn` result is an uncertain failure, so it acts at most `warn`.
        """
        action = self.action if result is not model.Result.WARN else model.milder(self.action, model.Action.WARN)
        if result in (model.Result.FAIL, model.Result.WARN, model.Result.ERROR):
            message = f"{self.id}: {self.summary}: {detail}" if detail else f"{self.id}: {self.summary}"
        else:
            message = detail
        return findings.finding(
            self.id, self.rule, result, action, self.severity, self.category, message, subject, tuple(related)
        )

    def verdict(
        self,
        subject: findings.ObjectRef,
        problems: Sequence[str],
        *,
        passed: str,
        related: Sequence[findings.ObjectRef] = (),
    ) -> findings.Finding:
        """A failure naming `problems` where there are any, else a pass with the detail `passed`.

        The failure's detail joins the problems with "; "; it relates the first `MAX_RELATED` of `related`.
        """
        if problems:
            return self.finding(subject, result=model.Result.FAIL, detail="; ".join(problems), related=related[:MAX_RELATED])
        return self.finding(subject, result=model.Result.PASS, detail=passed)


def shortened(problems: Sequence[str]) -> list[str]:
    """The first `MAX_NAMED` problems, then how many more there are."""
    extra = len(problems) - MAX_NAMED
    return list(problems[:MAX_NAMED]) + ([f"and {extra} more"] if extra > 0 else [])


# --- the kinds of object ---------------------------------------------------------------------------


class TemplateCheck(Check):
    """Judges a Pod or a workload (Deployment, Job, CronJob, ...) by its pod template alone."""

    @abc.abstractmethod
    def check_template(self, obj: Mapping[str, Any]) -> findings.Finding | None:
        """The result on `obj`; None where the check does not apply to it."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class PodContext:
    """What a pod check may look at besides the pod."""

    now: float  # Unix time, for allocations and reservations that expire
    node: Mapping[str, Any] | None = None  # the node the pod is bound to; None: unbound, or no such node
    nodes: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)  # every node, by name
    # Each node's card model, read once per audit and shared by every pod context of the run.
    models: dict[str, cards.NodeCards] = dataclasses.field(default_factory=dict)
    # The pod's card request and allocation, parsed once for all pod checks (one per audit run).
    parses: podparse.PodParses = dataclasses.field(default_factory=podparse.PodParses)
    # `facts.is_gpu_node(node)`, where the scan worked it out once for the node; None: not known.
    gpu_node: bool | None = None

    def node_has_gpus(self) -> bool:
        """`facts.is_gpu_node` of `node` (False without a node)."""
        if self.node is None:
            return False
        return self.gpu_node if self.gpu_node is not None else facts.is_gpu_node(self.node)


class PodCheck(Check):
    """Judges a Pod as it runs: where it is bound, what it holds, what its processes use."""

    @abc.abstractmethod
    def check_pod(self, pod: Mapping[str, Any], context: PodContext) -> findings.Finding | None:
        """The result on `pod`; None where the check does not apply to it."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class NodeContext:
    """What a node check may look at besides the node (only whole-cluster audits judge nodes)."""

    state: cards.NodeState  # the node's cards and the allocations holding them
    now: float  # Unix time
    # The pods bound to the node (`spec.nodeName`) and every pod of the cluster by uid, as the scan
    # keeps them (`scan.kept_for_cluster_checks`): no managedFields, and of the status only the phase.
    pods: Sequence[Mapping[str, Any]] = ()
    pods_by_uid: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    # The node's ledger Lease (`policies.gpu.reservations`), where it has one the scan trusts (in the
    # ledger namespace, naming this node), and the entries it holds.
    lease: findings.ObjectRef | None = None
    lease_ledger: Mapping[str, allocation.Allocation] = dataclasses.field(default_factory=dict)
    # The settings' trust zone: which labels mark GPU nodes, which resources are GPUs (GPU217).
    zone: trustzone.TrustZone = trustzone.DEFAULT_ZONE

    def ledger(self, node: Mapping[str, Any]) -> dict[str, allocation.Allocation]:
        """The node's whole reservation ledger: its Node annotation's entries (from earlier versions)
        and its Lease's, which win where both hold a pod."""
        return {**reservations.node_reservations(node), **self.lease_ledger}

    def where(self, uid: str) -> str:
        """Where a ledger entry lives, for a message: " (ledger Lease ns/name)" for the Lease's, else ""."""
        if self.lease is not None and uid in self.lease_ledger:
            return f" (ledger Lease {self.lease.namespace}/{self.lease.name})"
        return ""


class NodeCheck(Check):
    """Judges a GPU node: its labels, advertised resources, reservation ledger, cards and their use."""

    @abc.abstractmethod
    def check_node(self, node: Mapping[str, Any], context: NodeContext) -> findings.Finding | None:
        """The result on `node`; None where the check does not apply to it."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvSourceContext:
    """What an env-source check may look at besides the source."""

    # The Pods and workloads of the source's namespace that take a ConfigMap or Secret by envFrom
    # (kept as for NodeContext.pods): only they can deliver a source's keys.
    consumers: Sequence[Mapping[str, Any]] = ()


class EnvSourceCheck(Check):
    """Judges a ConfigMap or Secret, reduced to its keys (`envsources.keys_only`): never a value."""

    @abc.abstractmethod
    def check_source(self, source: Mapping[str, Any], context: EnvSourceContext) -> findings.Finding | None:
        """The result on `source`; None where the check does not apply to it."""


class ExceptionCheck(Check):
    """Judges an exception of the settings file (cluster-wide audits only)."""

    @abc.abstractmethod
    def check_exception(self, exception: settings.PolicyException, *, now: datetime.datetime) -> findings.Finding | None:
        """The result on `exception` at `now`; None where the check does not apply to it."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class BudgetContext:
    """A namespace with a GPU budget, as a budget check sees it (whole-cluster audits only: the
    usage needs every pod of the namespace, the ledger Leases and the ResourceSlices)."""

    namespace: str
    budget: settings.Budget  # the `gpuBudgets` entry that selects the namespace
    usage: budgets.Usage  # what it holds (`policies.gpu.budgets.usage`), per pod (uid) or claim (`claim:<uid>`)
    holders: Mapping[str, findings.ObjectRef]  # the Pod or ResourceClaim of each key of `usage.by_holder`
    lease: findings.ObjectRef | None = None  # its budget ledger Lease, where it has one the scan trusts

    def holder(self, key: str) -> findings.ObjectRef:
        """The object charged under `key` (a Pod named by its uid where the scan did not list it)."""
        found = self.holders.get(key)
        if found is not None:
            return found
        if key.startswith("claim:"):
            return findings.ObjectRef(
                namespace=self.namespace, kind="ResourceClaim", name=key[6:], api_version="resource.k8s.io/v1"
            )
        return findings.ObjectRef(namespace=self.namespace, kind="Pod", name=key, api_version="v1", uid=key)


class NamespaceCheck(Check):
    """Judges a namespace that has a GPU budget: what it holds against the budget."""

    @abc.abstractmethod
    def check_namespace(self, namespace: findings.ObjectRef, context: BudgetContext) -> findings.Finding | None:
        """The result on the namespace; None where the check does not apply to it."""


class ChargeCheck(Check):
    """Judges one pod or DRA claim charged to a budgeted namespace, by its key in the usage."""

    @abc.abstractmethod
    def check_charge(self, holder: str, context: BudgetContext) -> findings.Finding | None:
        """The result on the holder (`context.holder(holder)`); None where the check does not apply."""
