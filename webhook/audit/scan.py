"""One audit run, pure: Pods, workloads and Nodes in; every finding (passes included) out.

What is judged:

- every validate policy (GPU001-GPU005) on every Pod and workload template (Deployment,
  StatefulSet, DaemonSet, ReplicaSet, ReplicationController, Job, CronJob), through the same
  `engine.evaluate` as the webhook, with the configured action recorded on each result whatever it
  is (enforce, warn, audit); a policy set to `off` is a `skip` result. Objects are judged as
  stored: mutators are switched off, because an existing pod never got their additions (a pod
  created before the webhook, say), and reporting on a mutated copy would hide exactly that.
  GPU008 is left out (`Policy.stored_objects`): it judges what a request writes, and a bound pod
  carries nodeName and the extender's annotations by design; GPU210 judges the stored pod;
- the consistency checks of `checks` (GPU201-GPU219), every registered one of each kind from
  `checks.CHECKS`: per Pod and workload template, per Pod as it runs, per Node and its cards, per
  ConfigMap/Secret (from keys-only copies: no Secret value is kept), per settings exception,
  and, for each namespace with a GPU budget (`gpuBudgets`), per namespace and per pod or DRA claim
  charged to it (whole-cluster audits only).

Decisions:

- Exempt namespaces: every result on an object there becomes `skip`, with the reason as message
  (nodes are cluster-scoped and never exempt; pods in exempt namespaces still count towards their
  cards' occupation).
- Controlled objects: Kyverno reports a Deployment, its ReplicaSets and their Pods alike, so one
  bad template shows up three times (more with replicas). Here a result on an object with a
  controller (`ownerReferences[].controller`) is left out when a controller up its chain carries
  the same result (policy, rule, result and message): the finding is reported once, where it is
  fixed. Results that differ are kept, so a pod from an older template, one changed by a
  mutating webhook, or a pod-only check (GPU201, GPU203, GPU204) still appear on the pod.
- Scope: with a namespace filter, node-level checks that need every pod of the cluster (GPU202,
  the ledger part of GPU203) and all node results are not run, and the ClusterPolicyReport is
  left alone; pod-level checks against nodes still run.
- The reservation ledger: a node's is the union of its Node annotation (written by versions before
  the ledger Lease) and its ledger Lease, trusted only in the ledger namespace and when it names
  its node (`policies.gpu.reservations.lease_node`); node states and the checks count both.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from policies import cel, engine, envsources, lookups, model, podspec, policy
from policies import settings as settings_
from policies.gpu import budgetusage, cards, dra, podparse, reservations
from webhook.audit import checks, findings, verdicts
from webhook.audit.checks import base, facts, gpu217_unrecognised_gpu_node

DEFAULT_NAMESPACE = "default"
WORKLOAD_KINDS: tuple[str, ...] = (
    "Deployment",
    "StatefulSet",
    "DaemonSet",
    "ReplicaSet",
    "ReplicationController",
    "Job",
    "CronJob",
)
AUDITED_KINDS: frozenset[str] = frozenset({"Pod", *WORKLOAD_KINDS})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Describer:
    """How reports present a built-in policy: rule name, severity, category."""

    rule: str
    severity: findings.Severity
    category: str


# Severity is a property of what a policy protects, not of its configured action.
_BUILTIN: Mapping[str, tuple[findings.Severity, str]] = {
    "GPU001": (findings.Severity.HIGH, "GPU Security"),
    "GPU002": (findings.Severity.HIGH, "GPU Security"),
    "GPU003": (findings.Severity.HIGH, "GPU Security"),
    "GPU004": (findings.Severity.MEDIUM, "GPU Resources"),
    "GPU005": (findings.Severity.MEDIUM, "GPU Scheduling"),
}


def _kebab(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower()


def describe(item: policy.Policy) -> Describer:
    """A policy's rule name (a built-in's class name in kebab case, a user policy's name), severity and category."""
    severity, category = _BUILTIN.get(item.id, (findings.Severity.MEDIUM, "GPU"))
    spec = cel.spec_of(item)
    return Describer(rule=spec.name if spec else _kebab(type(item).__name__), severity=severity, category=category)


# The registered checks by the kind of object they judge (a check of two kinds is in both).
TEMPLATE_CHECKS: tuple[base.TemplateCheck, ...] = tuple(c for c in checks.CHECKS if isinstance(c, base.TemplateCheck))
POD_CHECKS: tuple[base.PodCheck, ...] = tuple(c for c in checks.CHECKS if isinstance(c, base.PodCheck))
NODE_CHECKS: tuple[base.NodeCheck, ...] = tuple(c for c in checks.CHECKS if isinstance(c, base.NodeCheck))
# Pod checks whose result depends on the pod only through what `verdicts` keys a template by (not
# its name or uid) and on what is fixed for a run (its node by spec.nodeName, every node, the
# clock): remembered with the policies' results for the replicas of one template. GPU203's pod
# part reads the allocation annotation, spec.nodeName and status.phase, all in the key (its node
# part, which reads the ledger's uids, runs per node). The other reads the pod's uid (GPU214: a
# card's usage by pod) and runs on each pod. Results come in another order than POD_CHECKS';
# `_sorted` orders them all the same.
SHARED_POD_CHECK_IDS: frozenset[str] = frozenset({"GPU201", "GPU203", "GPU204", "GPU210"})
ENV_SOURCE_CHECKS: tuple[base.EnvSourceCheck, ...] = tuple(c for c in checks.CHECKS if isinstance(c, base.EnvSourceCheck))
EXCEPTION_CHECKS: tuple[base.ExceptionCheck, ...] = tuple(c for c in checks.CHECKS if isinstance(c, base.ExceptionCheck))
NAMESPACE_CHECKS: tuple[base.NamespaceCheck, ...] = tuple(c for c in checks.CHECKS if isinstance(c, base.NamespaceCheck))
CHARGE_CHECKS: tuple[base.ChargeCheck, ...] = tuple(c for c in checks.CHECKS if isinstance(c, base.ChargeCheck))

# The validators that can judge an object as stored; a policy on what a request writes (GPU008:
# nodeName and allocation annotations, which a bound pod carries by design) is left out.
VALIDATORS: tuple[policy.Policy, ...] = tuple(
    p for p in engine.POLICIES if p.kind is model.PolicyKind.VALIDATE and p.stored_objects
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Inventory:
    """What the audit looks at, as decoded JSON objects (the kube adapter or manifest files give them)."""

    # Possibly a one-shot stream (`streamed`): `run` reads it once, judging each pod as it comes.
    pods: Iterable[Mapping[str, Any]] = ()
    workloads: tuple[Mapping[str, Any], ...] = ()
    nodes: tuple[Mapping[str, Any], ...] = ()
    # ConfigMaps and Secrets, keys only (`envsources.keys_only`): GPU211 needs no value.
    env_sources: tuple[Mapping[str, Any], ...] = ()
    # Labels by namespace name, from the Namespace objects seen: namespace overrides select on
    # them exactly as in the webhook. A namespace missing here has only its name label.
    namespace_labels: Mapping[str, Mapping[str, str]] = dataclasses.field(default_factory=dict)
    # Leases: the nodes' reservation ledgers (`policies.gpu.reservations`). `run` trusts only those in
    # the ledger namespace that name their node; any other Lease is ignored.
    leases: tuple[Mapping[str, Any], ...] = ()
    # Dynamic Resource Allocation (`policies.gpu.dra`): ResourceClaims and ResourceClaimTemplates (GPU011
    # judges them, and pods by them), and the ResourceSlices that say which card a claim holds.
    claims: tuple[Mapping[str, Any], ...] = ()
    slices: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def of(cls, objects: Iterable[Mapping[str, Any]]) -> Inventory:
        """Sort a mixed bag of objects; kinds the audit does not judge (but Namespaces' labels) are dropped."""
        pods: list[Mapping[str, Any]] = []
        workloads: list[Mapping[str, Any]] = []
        nodes: list[Mapping[str, Any]] = []
        namespaces: list[Mapping[str, Any]] = []
        env_sources: list[Mapping[str, Any]] = []
        leases: list[Mapping[str, Any]] = []
        claims: list[Mapping[str, Any]] = []
        slices: list[Mapping[str, Any]] = []
        for obj in objects:
            kind = obj.get("kind")
            if kind == "Pod":
                pods.append(obj)
            elif kind in envsources.SOURCE_KINDS:
                env_sources.append(envsources.keys_only(obj))
            elif kind in WORKLOAD_KINDS:
                workloads.append(obj)
            elif kind == "Node":
                nodes.append(obj)
            elif kind == "Namespace":
                namespaces.append(obj)
            elif kind == "Lease":
                leases.append(obj)
            elif kind in dra.CLAIM_KINDS:
                claims.append(obj)
            elif kind == "ResourceSlice":
                slices.append(obj)
        return cls(
            pods=tuple(pods),
            workloads=tuple(workloads),
            nodes=tuple(nodes),
            env_sources=tuple(env_sources),
            namespace_labels=settings_.labels_by_namespace(namespaces),
            leases=tuple(leases),
            claims=tuple(claims),
            slices=tuple(slices),
        )

    @classmethod
    def streamed(cls, objects: Iterable[Mapping[str, Any]]) -> Inventory:
        """Like `of`, for a stream whose Pods come last (`kube.objects`): everything before the
        first Pod is read now, the Pods stay a stream that `run` judges one by one, so no more of
        them is held than `run` keeps (see `run`)."""
        stream = iter(objects)
        before: list[Mapping[str, Any]] = []
        first: Mapping[str, Any] | None = None
        for obj in stream:
            if obj.get("kind") == "Pod":
                first = obj
                break
            before.append(obj)
        sorted_out = cls.of(before)
        if first is None:
            return sorted_out

        def pods() -> Iterator[Mapping[str, Any]]:
            yield first
            for obj in stream:
                if obj.get("kind") != "Pod":
                    raise ValueError(f"a {obj.get('kind')} after the Pods: the stream must end with its Pods")
                yield obj

        return dataclasses.replace(sorted_out, pods=pods())


@dataclasses.dataclass(frozen=True, kw_only=True)
class Scope:
    """Which namespaces the audit covers (None: all) and whether node-level findings belong to it."""

    namespaces: frozenset[str] | None = None

    @property
    def cluster(self) -> bool:
        """Whether cluster-scoped findings (nodes) are part of this audit."""
        return self.namespaces is None

    def covers(self, namespace: str) -> bool:
        return self.namespaces is None or namespace in self.namespaces


@dataclasses.dataclass(frozen=True, kw_only=True)
class Audit:
    """The outcome of one run."""

    findings: tuple[findings.Finding, ...]  # sorted by object, folded results left out
    scope: Scope
    objects: int  # objects judged (pods, workloads, nodes)
    folded: int  # results left out because the object's controller carries the same one
    namespaces: frozenset[str]  # the namespaces holding audited objects
    nodes: tuple[cards.NodeState, ...] = ()  # per-card occupation of every GPU node, for pictures
    # Namespaces labelled for DRA admin access (`dra.ADMIN_ACCESS_LABEL`: true), where claims may
    # ask for `adminAccess`, which Kubernetes allows there and GPU011 narrows to `dra.adminNamespaces`.
    admin_access_namespaces: tuple[str, ...] = ()

    @property
    def exit_status(self) -> int:
        """0: no failure at enforce level; 1: at least one."""
        return 1 if any(f.enforced for f in self.findings) else 0


def audit_settings(configured: settings_.Settings) -> settings_.Settings:
    """The settings with every mutator off, so objects are judged as they are stored (and the
    validators that cannot judge a stored object off too: their results would be unused)."""
    mutators = (item.id for item in engine.POLICIES if item.kind is model.PolicyKind.MUTATE)
    return configured.for_stored_objects().switched_off(mutators)


def namespace_of(obj: Mapping[str, Any], *, default: str = DEFAULT_NAMESPACE) -> str:
    """The object's namespace, `default` where it names none (manifest files often do not)."""
    value = podspec.mapping(obj.get("metadata")).get("namespace")
    return value if isinstance(value, str) and value else default


def _with_namespace(obj: Mapping[str, Any], namespace: str) -> Mapping[str, Any]:
    metadata = podspec.mapping(obj.get("metadata"))
    if metadata.get("namespace") == namespace:
        return obj
    return {**obj, "metadata": {**metadata, "namespace": namespace}}


def evaluate_policies(
    obj: Mapping[str, Any],
    *,
    namespace: str,
    configured: settings_.Settings,
    effective: settings_.Settings,
    env_lookup: model.EnvLookup | None = None,
    now: datetime.datetime | None = None,
    namespace_labels: Mapping[str, str] | None = None,
    described: Mapping[str, Describer] | None = None,
    claims: Mapping[tuple[str, str], Mapping[str, Any] | None] | None = None,
) -> list[findings.Finding]:
    """Every validate policy's result (user policies included) on one Pod or workload, with its action;
    `described` holds `describe` of each policy by id, computed once per run; `claims`: the DRA
    claims and templates of the namespace by (kind, name), all of them (one not there does not
    exist), or None where they were not listed."""
    subject = findings.ObjectRef.of(obj)
    if claims is not None:  # what the pod names, each found or known not to exist
        claims = {key: claims.get(key) or {} for key in lookups.claims_to_look_up(obj)}
    decision = engine.evaluate(
        model.Request(
            operation="CREATE",
            object=obj,
            namespace=namespace,
            env_lookup=env_lookup,
            now=now,
            namespace_labels=namespace_labels,
            claims=claims,
        ),
        settings=effective,
    )
    by_policy = {result.policy: result for result in decision.results}
    out: list[findings.Finding] = []
    for item in (*VALIDATORS, *configured.user_policies):
        if not policy.judges(item, obj.get("kind")):
            continue  # a pod policy on a ConfigMap, GPU007 on a pod: not a result at all
        description = described[item.id] if described is not None and item.id in described else describe(item)
        action = configured.action(item.id, namespace=namespace, namespace_labels=namespace_labels)
        found = by_policy.get(item.id)
        if decision.exempt_reason or found is None:
            result, message = model.Result.SKIP, decision.exempt_reason or "not evaluated"
        else:
            result = found.result
            if result is model.Result.PASS:
                message = ""
            elif result is model.Result.SKIP:
                message = f"{item.id}: the policy is {found.message or 'skipped'}"
            elif result is model.Result.ERROR:
                message = found.message
                action = model.milder(action, configured.error_action(model.PolicyKind.VALIDATE))
            else:
                message = f"{item.id}: {item.summary}: {found.message}"
                if result is model.Result.WARN:
                    action = model.milder(action, model.Action.WARN)
        out.append(
            findings.finding(
                item.id, description.rule, result, action, description.severity, description.category, message, subject
            )
        )
    return out


def _lease_ref(lease: Mapping[str, Any]) -> findings.ObjectRef:
    return dataclasses.replace(findings.ObjectRef.of(lease), kind="Lease", api_version="coordination.k8s.io/v1")


def _exempt(found: findings.Finding, reason: str) -> findings.Finding:
    return dataclasses.replace(found, result=model.Result.SKIP, message=reason, related=())


class _Key(NamedTuple):  # a tuple: made and hashed several times per judged object
    namespace: str
    kind: str
    name: str


def _key(obj: Mapping[str, Any], namespace: str) -> _Key:
    return _Key(namespace, str(obj.get("kind", "")), facts.name_of(obj))


def _controller(obj: Mapping[str, Any], namespace: str) -> tuple[_Key, str] | None:
    for ref in podspec.sequence(podspec.mapping(obj.get("metadata")).get("ownerReferences")):
        ref = podspec.mapping(ref)
        if ref.get("controller") is True and isinstance(ref.get("kind"), str) and isinstance(ref.get("name"), str):
            return _Key(namespace, ref["kind"], ref["name"]), str(ref.get("uid", ""))
    return None


def _fold(
    per_object: Mapping[_Key, list[findings.Finding]],
    owners: Mapping[_Key, tuple[_Key, str]],
    uids: Mapping[_Key, str],
) -> tuple[list[findings.Finding], int]:
    """Drop results that a controller up the object's chain already carries."""
    kept: list[findings.Finding] = []
    folded = 0
    for key, results in per_object.items():
        inherited: set[tuple[str, str, str, str]] = set()
        seen = {key}
        current = owners.get(key)
        while current is not None and current[0] not in seen:
            owner, uid = current
            if owner not in per_object or (uid and uids.get(owner) and uids[owner] != uid):
                break  # the controller is not audited here (or is another object of that name)
            inherited.update(f.identity() for f in per_object[owner])
            seen.add(owner)
            current = owners.get(owner)
        if not inherited:  # most objects: no audited controller, nothing to fold
            kept.extend(results)
            continue
        for found in results:
            if found.identity() in inherited:
                folded += 1
            else:
                kept.append(found)
    return kept, folded


# --- the pods the node-level and env-source checks look at ------------------------------------------
#
# A pod is judged whole, as it arrives, and then dropped; what stays for the checks that look across
# pods (GPU202-GPU215 on a node: its pods and every pod by uid; GPU211: who takes a source by envFrom)
# is the pod less what no such check reads: `metadata.managedFields` and every status field but
# `phase` (the one `allocation.is_terminal` reads). It is kept as compact JSON (a pod of 21 KiB in
# memory is about 2 KB there) and decoded again one node at a time. 100,000 pods then cost about
# 200 MB instead of 2 GB. Where orjson cannot write a pod (a lone surrogate, an integer past 64
# bits) that pod is kept decoded.

_Packed = bytes | Mapping[str, Any]


def kept_for_cluster_checks(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod as the cross-pod checks see it: no managedFields, and of its status only the phase."""
    slim = {key: value for key, value in pod.items() if key not in ("metadata", "status")}
    if "metadata" in pod:
        metadata = pod["metadata"]
        slim["metadata"] = (
            {key: value for key, value in metadata.items() if key != "managedFields"}
            if isinstance(metadata, Mapping)
            else metadata
        )
    if "status" in pod:
        status = pod["status"]
        slim["status"] = {"phase": status["phase"]} if isinstance(status, Mapping) and "phase" in status else {}
    return slim


def _pack(pod: Mapping[str, Any]) -> _Packed:
    slim = kept_for_cluster_checks(pod)
    try:
        written = orjson.dumps(slim)
    except (TypeError, orjson.JSONEncodeError):
        return slim
    # orjson's bytes keep the block its writer grew (about 8 KiB for a 3.7 KB pod); a copy is exact.
    return bytes(memoryview(written))


def _unpack(packed: _Packed) -> Mapping[str, Any]:
    if isinstance(packed, bytes):
        found: Mapping[str, Any] = orjson.loads(packed)
        return found
    return packed


class _PodsByUid(Mapping[str, Mapping[str, Any]]):
    """Every pod by uid, decoded on lookup (the checks look up the few pods a reservation names)."""

    def __init__(self, kept: Sequence[_Packed], index: Mapping[str, int]) -> None:
        self._kept = kept
        self._index = index
        # The pods of the node being judged, already decoded (by position in `kept`): a check that
        # looks up one of them by uid gets that copy instead of decoding it again.
        self.decoded: Mapping[int, Mapping[str, Any]] = {}

    def __getitem__(self, uid: str) -> Mapping[str, Any]:
        position = self._index[uid]
        found = self.decoded.get(position)
        return found if found is not None else _unpack(self._kept[position])

    def __contains__(self, uid: object) -> bool:
        return uid in self._index

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


def _takes_by_env_from(obj: Mapping[str, Any]) -> bool:
    """Whether a container of the object takes a ConfigMap or Secret whole (`envFrom`): only such
    objects can deliver a source's keys, so only they are GPU211's consumers."""
    spec = obj.get("spec")
    if obj.get("kind") == "Pod" and type(spec) is dict:  # a Pod's template is its spec: no paths built
        return any(
            isinstance(container, Mapping) and podspec.sequence(container.get("envFrom"))
            for kind in podspec.CONTAINER_KINDS
            for container in podspec.sequence(spec.get(kind))
        )
    template = podspec.template(obj)
    return template is not None and any(
        podspec.sequence(ref.container.get("envFrom")) for ref in podspec.iter_containers(template.spec, spec_path="")
    )


def _sorted(results: list[findings.Finding]) -> tuple[findings.Finding, ...]:
    """`sorted(results, key=findings.sort_key)`, without a million key tuples at once: grouped by
    subject (the key's first three fields) in order of appearance, the groups sorted, then each group
    by the rest of the key. Both sorts are stable, so the order is exactly the one-sort order."""
    groups: dict[tuple[str, str, str], list[findings.Finding]] = {}
    for found in results:
        subject = found.subject
        groups.setdefault((subject.namespace, subject.kind, subject.name), []).append(found)
    results.clear()
    ordered: list[findings.Finding] = []
    for key in sorted(groups):
        group = groups.pop(key)
        if len(group) > 1:
            group.sort(key=findings.sort_key)
        ordered.extend(group)
    return tuple(ordered)


def run(
    inventory: Inventory,
    *,
    settings: settings_.Settings,
    scope: Scope = Scope(),
    now: float,
    env_lookup: model.EnvLookup | None = None,
    default_namespace: str = DEFAULT_NAMESPACE,
    ledger_namespace: str = reservations.LEDGER_NAMESPACE,
    remember: bool = True,
) -> Audit:
    """Judge everything in `inventory` that `scope` covers; never raises on odd objects.

    The pods are read once, in one pass (`inventory.pods` may be a stream): each is judged whole,
    then only `kept_for_cluster_checks` of it stays, packed, for the node-level checks. A node's
    reservation ledger is its Node annotation's (earlier versions) and its ledger Lease's, a Lease
    trusted only in `ledger_namespace` (tenants can create Leases in their own namespaces).
    """
    effective = audit_settings(settings)
    moment = datetime.datetime.fromtimestamp(now, datetime.UTC)  # for exception expiry
    nodes_by_name = {facts.name_of(node): node for node in inventory.nodes}
    gpu_nodes = {facts.name_of(node) for node in inventory.nodes if facts.is_gpu_node(node)}
    models: dict[str, cards.NodeCards] = {}
    per_object: dict[_Key, list[findings.Finding]] = {}
    owners: dict[_Key, tuple[_Key, str]] = {}
    uids: dict[_Key, str] = {}
    namespaces: set[str] = set()
    described = {item.id: describe(item) for item in (*VALIDATORS, *settings.user_policies)}
    objects = 0
    memo = verdicts.Memo(settings) if remember else None
    shared_pod_checks = tuple(c for c in POD_CHECKS if c.id in SHARED_POD_CHECK_IDS)
    own_pod_checks = tuple(c for c in POD_CHECKS if c.id not in SHARED_POD_CHECK_IDS)
    if memo is not None and not memo.enabled:
        memo = None
    budget_cache: dict[str, settings_.Budget | None] = {}

    def budget_of(namespace: str) -> settings_.Budget | None:
        if not settings.gpu_budgets:
            return None
        if namespace not in budget_cache:
            budget_cache[namespace] = settings.gpu_budget(namespace, inventory.namespace_labels.get(namespace))
        return budget_cache[namespace]

    budgeted: dict[str, list[int]] = {}  # the pods of each budgeted namespace, by position in `kept`
    # The DRA claims and templates of each namespace, for GPU011 on the pods that use them: the audit
    # lists them all, so one it does not have does not exist.
    claims_by_namespace: dict[str, dict[tuple[str, str], Mapping[str, Any] | None]] = {}
    for claim in inventory.claims:
        claims_by_namespace.setdefault(namespace_of(claim, default=default_namespace), {})[
            (str(claim.get("kind")), str(podspec.mapping(claim.get("metadata")).get("name", "")))
        ] = claim

    def placed_in(found: findings.Finding, namespace: str) -> findings.Finding:
        if found.subject.namespace == namespace:
            return found
        return dataclasses.replace(found, subject=dataclasses.replace(found.subject, namespace=namespace))

    def policy_results(placed: Mapping[str, Any], namespace: str) -> list[findings.Finding]:
        return evaluate_policies(
            placed,
            namespace=namespace,
            configured=settings,
            effective=effective,
            env_lookup=env_lookup,
            now=moment,
            namespace_labels=inventory.namespace_labels.get(namespace),
            described=described,
            claims=claims_by_namespace.get(namespace, {}),
        )

    def pod_results(
        obj: Mapping[str, Any], placed: Mapping[str, Any], namespace: str, context: base.PodContext
    ) -> list[findings.Finding]:
        """A pod's results: the policies', the template checks' and the pod checks'. All but those of
        the pod checks that read the pod's identity are remembered per template (`verdicts`)."""
        own = [placed_in(found, namespace) for check in own_pod_checks if (found := check.check_pod(obj, context)) is not None]
        keyed = memo.key(placed) if memo is not None else None
        subject = findings.ObjectRef.of(placed)
        if keyed is not None and memo is not None:
            remembered = memo.get(keyed[0], subject)
            if remembered is not None:
                return remembered + own
        judged: list[findings.Finding] | None = None
        policies_keyed = memo.policies_key(placed) if keyed is not None and memo is not None else None
        if policies_keyed is not None and memo is not None:
            judged = memo.get_policies(policies_keyed[0], subject)
        if judged is None:
            # The template checks' results go with the policies': like the validators, they read
            # neither spec.nodeName nor an allocation annotation (`verdicts.policies_form`).
            judged = policy_results(placed, namespace) + [
                placed_in(found, namespace) for check in TEMPLATE_CHECKS if (found := check.check_template(obj)) is not None
            ]
            if policies_keyed is not None and memo is not None:
                memo.put_policies(policies_keyed[0], policies_keyed[1], subject, judged)
        shared = judged + [
            placed_in(found, namespace) for check in shared_pod_checks if (found := check.check_pod(obj, context)) is not None
        ]
        if keyed is not None and memo is not None:
            memo.put(keyed[0], keyed[1], subject, shared)
        return shared + own

    def judge(obj: Mapping[str, Any], extra: Sequence[findings.Finding | None], *, pod: base.PodContext | None = None) -> None:
        """Judge a workload (`extra`: its template checks' results) or, with `pod`, a pod."""
        nonlocal objects
        namespace = namespace_of(obj, default=default_namespace)
        placed = _with_namespace(obj, namespace)
        if pod is None:
            results = policy_results(placed, namespace)
            results += [placed_in(found, namespace) for found in extra if found is not None]
        else:
            results = pod_results(obj, placed, namespace, pod)
        if namespace in settings.exempt_namespaces:
            reason = f"namespace {namespace} is exempt"
            results = [_exempt(found, reason) for found in results]
        key = _key(placed, namespace)
        per_object.setdefault(key, []).extend(results)
        uids[key] = str(podspec.mapping(placed.get("metadata")).get("uid", ""))
        controller = _controller(placed, namespace)
        if controller is not None:
            owners[key] = controller
        namespaces.add(namespace)
        objects += 1

    # GPU211's consumers by namespace: the workloads and pods that take a source by envFrom.
    consumers: dict[str, list[Mapping[str, Any]]] = {}
    for workload in inventory.workloads:
        if scope.covers(namespace_of(workload, default=default_namespace)):
            judge(workload, [check.check_template(workload) for check in TEMPLATE_CHECKS])
        if _takes_by_env_from(workload):
            consumers.setdefault(namespace_of(workload, default=default_namespace), []).append(workload)

    for claim in inventory.claims:  # GPU011: who may claim GPUs, and adminAccess
        if scope.covers(namespace_of(claim, default=default_namespace)):
            judge(claim, ())

    # One pass over the pods: judge each, keep what the node-level checks need (see above).
    kept: list[_Packed] = []
    uid_index: dict[str, int] = {}
    grouped: dict[str, list[int]] = {}  # by the node a pod occupies or reserves (`cards.pod_node`)
    bound: dict[str, list[int]] = {}  # by `spec.nodeName`
    parses = podparse.PodParses()  # each pod's request and allocation, read once by all pod checks
    contexts: dict[str, base.PodContext] = {}  # one per node a pod names: they differ in the node only
    for pod in inventory.pods:
        namespace = namespace_of(pod, default=default_namespace)
        if scope.covers(namespace):
            bound_to = str(podspec.mapping(pod.get("spec")).get("nodeName") or "")
            context = contexts.get(bound_to)
            if context is None:
                node = nodes_by_name.get(bound_to)
                context = contexts[bound_to] = base.PodContext(
                    now=now,
                    node=node,
                    nodes=nodes_by_name,
                    models=models,
                    parses=parses,
                    gpu_node=node is not None and facts.is_gpu_node(node),
                )
            judge(pod, (), pod=context)
        if _takes_by_env_from(pod):
            consumers.setdefault(namespace, []).append(kept_for_cluster_checks(pod))
        if not scope.cluster:
            continue
        position = len(kept)
        kept.append(_pack(pod))
        uid = podspec.mapping(pod.get("metadata")).get("uid")
        if uid:
            uid_index[str(uid)] = position
        occupied = cards.pod_node(pod)
        if occupied in gpu_nodes:
            grouped.setdefault(occupied, []).append(position)
        node_name = podspec.mapping(pod.get("spec")).get("nodeName")
        if isinstance(node_name, str) and node_name in gpu_nodes:
            bound.setdefault(node_name, []).append(position)
        if budget_of(namespace) is not None:
            budgeted.setdefault(namespace, []).append(position)
    results, folded = _fold(per_object, owners, uids)
    per_object.clear()  # every finding is in results now (judge() above is not called again)

    for source in inventory.env_sources:
        namespace = namespace_of(source, default=default_namespace)
        if not scope.covers(namespace):
            continue
        placed = _with_namespace(source, namespace)
        source_context = base.EnvSourceContext(consumers=consumers.get(namespace, ()))
        judged = [found for check in ENV_SOURCE_CHECKS if (found := check.check_source(placed, source_context)) is not None]
        if not judged:
            continue
        if namespace in settings.exempt_namespaces:
            judged = [_exempt(found, f"namespace {namespace} is exempt") for found in judged]
        results.extend(judged)
        namespaces.add(namespace)
        objects += 1

    states: list[cards.NodeState] = []
    if scope.cluster:
        pods_by_uid = _PodsByUid(kept, uid_index)
        leases = reservations.leases_by_node(inventory.leases, namespace=ledger_namespace)
        held = dra.holds(inventory.slices, inventory.claims, namespace=ledger_namespace)  # cards allocated through DRA (GPU216)
        for node in inventory.nodes:
            # GPU217 also judges a node that only its allocatable or a configured resource makes one.
            if not facts.is_gpu_node(node) and not gpu217_unrecognised_gpu_node.gpu_resources(node, settings.trust_zone):
                continue
            objects += 1
            node_name = facts.name_of(node)
            # This node's pods, decoded once for both lists and dropped after its checks.
            decoded = {i: _unpack(kept[i]) for i in dict.fromkeys((*grouped.get(node_name, ()), *bound.get(node_name, ())))}
            pods_by_uid.decoded = decoded
            lease = leases.get(node_name)
            lease_ledger = reservations.lease_reservations(lease, namespace=ledger_namespace) if lease is not None else {}
            ledger = {**reservations.node_reservations(node), **lease_ledger}
            state = cards.node_state(
                node,
                [decoded[i] for i in grouped.get(node_name, ())],
                now=now,
                reservations=ledger,
                dra_holds=held.get(node_name, dra.NO_HOLDS),
            )
            if state.node.cards:
                states.append(state)
            node_context = base.NodeContext(
                state=state,
                now=now,
                pods=[decoded[i] for i in bound.get(node_name, ())],
                pods_by_uid=pods_by_uid,
                lease=_lease_ref(lease) if lease is not None else None,
                lease_ledger=lease_ledger,
                zone=settings.trust_zone,
            )
            results.extend(found for check in NODE_CHECKS if (found := check.check_node(node, node_context)) is not None)
        for exception in settings.exceptions:
            results.extend(
                found for check in EXCEPTION_CHECKS if (found := check.check_exception(exception, now=moment)) is not None
            )
        if settings.gpu_budgets:
            judged_budgets = _budget_results(
                inventory,
                budget_of=budget_of,
                # Decoded one namespace at a time, as the node checks decode one node's pods.
                pods=lambda ns: [_with_namespace(_unpack(kept[i]), ns) for i in budgeted.get(ns, ())],
                with_pods=budgeted,
                exempt=settings.exempt_namespaces,
                default_namespace=default_namespace,
                ledger_namespace=ledger_namespace,
                now=now,
            )
            objects += judged_budgets[1]
            results.extend(judged_budgets[0])
    return Audit(
        findings=_sorted(results),
        scope=scope,
        objects=objects,
        folded=folded,
        namespaces=frozenset(namespaces),
        nodes=tuple(sorted(states, key=lambda s: s.name)),
        admin_access_namespaces=admin_access_namespaces(inventory.namespace_labels, scope=scope),
    )


def _budget_results(
    inventory: Inventory,
    *,
    budget_of: Callable[[str], settings_.Budget | None],
    pods: Callable[[str], Sequence[Mapping[str, Any]]],
    with_pods: Iterable[str],
    exempt: Iterable[str],
    default_namespace: str,
    ledger_namespace: str,
    now: float,
) -> tuple[list[findings.Finding], int]:
    """GPU218 on each namespace with a budget and GPU219 on each pod or claim charged to one, and how
    many namespaces were judged; `pods` decodes a namespace's pods, `with_pods` names those that have any. A namespace is known by its Namespace object, its pods, its claims
    or its budget ledger Lease; results on its pods and claims in an exempt namespace are `skip`."""
    claims = [_with_namespace(c, namespace_of(c, default=default_namespace)) for c in inventory.claims]
    listed = budgetusage.listed(
        nodes=inventory.nodes, leases=inventory.leases, claims=claims, slices=inventory.slices, home=ledger_namespace
    )
    known = {*inventory.namespace_labels, *with_pods, *listed.claims, *listed.ledgers}
    exempt = frozenset(exempt)
    results: list[findings.Finding] = []
    judged = 0
    for namespace in sorted(known):
        budget = budget_of(namespace)
        if budget is None:
            continue
        judged += 1
        own = pods(namespace)
        holders = {str(podspec.mapping(p.get("metadata")).get("uid", "")): findings.ObjectRef.of(p) for p in own}
        for uid, name, _ in listed.claims.get(namespace, ()):
            holders[f"claim:{uid}"] = findings.ObjectRef(
                namespace=namespace, kind="ResourceClaim", name=name, api_version=f"{dra.GROUP}/{dra.VERSION}", uid=uid
            )
        lease = listed.ledgers.get(namespace)
        context = base.BudgetContext(
            namespace=namespace,
            budget=budget,
            usage=budgetusage.namespace_usage(namespace, own, listed, now=now),
            holders=holders,
            lease=_lease_ref(lease) if lease is not None else None,
        )
        subject = findings.ObjectRef(namespace="", kind="Namespace", name=namespace, api_version="v1")
        results.extend(found for check in NAMESPACE_CHECKS if (found := check.check_namespace(subject, context)) is not None)
        charged = [
            found
            for key in sorted(context.usage.by_holder)
            for check in CHARGE_CHECKS
            if (found := check.check_charge(key, context)) is not None
        ]
        if namespace in exempt:
            charged = [_exempt(found, f"namespace {namespace} is exempt") for found in charged]
        results.extend(charged)
    return results, judged


def admin_access_namespaces(labels: Mapping[str, Mapping[str, str]], *, scope: Scope) -> tuple[str, ...]:
    """The namespaces `scope` covers that carry Kubernetes' DRA admin-access label with "true"."""
    return tuple(sorted(ns for ns, found in labels.items() if found.get(dra.ADMIN_ACCESS_LABEL) == "true" and scope.covers(ns)))
