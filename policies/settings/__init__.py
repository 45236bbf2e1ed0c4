"""Engine settings: actions, namespace overrides, exceptions and the GPU parameters (no I/O).

`Settings()` is the built-in default. `from_mapping` parses the already-loaded YAML document
(loading files is the caller's job; this package does no I/O). The schema, every key optional:

```yaml
policies:                          # per-policy action: enforce | warn | audit | off
  GPU001: {action: enforce}
  GPU104: {action: off}            # YAML 1.1 reads a bare `off` as false; that means off too
  TEAM001: {action: warn}          # user (CEL) policies are named by their spec.id
namespaceOverrides:                # per-namespace actions; the first override that matches the
  - name: research                 #   namespace *and* names the policy decides
    namespaces: [research, lab-a]  # any of these names ...
    namespaceSelector:             # ... and/or namespaces whose labels match (metav1.LabelSelector)
      matchLabels: {gpu-admission.io/tier: lab}
      matchExpressions: [{key: env, operator: In, values: [dev, test]}]
    policies:
      GPU002: {action: warn}
exceptions:                        # a policy does not apply to matching objects: Result.SKIP,
  - name: dcgm-exporter            #   message "exception <name>"
    policies: [GPU002, GPU003]
    match:                         # every key given must hold; namespaces and/or namespaceSelector
      namespaces: [monitoring]     #   are required (tenants cannot label namespaces; a selector needs
      namespaceSelector: {matchLabels: {team: ops}}  # matchLabels, In or Exists); the rest narrow
      names: ["dcgm-exporter-*"]   # shell patterns on metadata.name (generateName when unnamed)
      objectSelector: {matchLabels: {app: dcgm-exporter}}  # the object's (and template's) labels
    expires: "2026-12-31T00:00:00Z"  # RFC 3339 (or a date: 00:00 UTC); afterwards it stops applying
    reason: needs /dev/nvidia* for DCGM metrics, OPS-1234
exemptNamespaces: [kube-system, kube-node-lease, gpu-admission]
defaultSharedMode: cgpu            # cgpu | share | mps: what GPU101 pins aliyun.com/gpu-mem pods to
gpuSchedulerName: ""               # GPU105 sets this schedulerName when non-empty
extenderSchedulers: [default-scheduler]  # GPU008: the schedulerNames whose scheduler calls the
                                   #   extender; gpuSchedulerName is always one of them
visibleDevicesNeutralValue: void   # what GPU104 writes and GPU001 accepts: void | none | ""
userPolicyBudgetSeconds: 1        # CPU time all user policies of one request may take together;
                                   #   the ones left when it is spent are errors (see policies.cel)
keepNonGpuPodsOffGpuNodes: false   # GPU103 for every pod without GPUs, not only privileged ones
trustZone:                         # what a pod that can reach a GPU node may have (policies.trustzone)
  strict: false                    # true: every pod is judged so, not only those that can reach one
  gpuResources: [example.com/gpu]  # GPU resources besides the built-in list (a trailing * is a prefix)
  gpuNodeTaints: [dedicated]       # taint keys of GPU nodes besides nvidia.com/gpu and the GPU names
  gpuNodeLabels:                   # labels that mark GPU nodes besides the built-in set
    - example.com/gpu-pool         #   (trustzone.DEFAULT_GPU_NODE_LABELS): a key marks a node with
    - {key: node-role, values: [gpu]}  # any value, values: only with one of them
  hostPorts: ["8000-8999", 8888]   # the host ports a pod that can reach a GPU node may have; default:
                                   #   1024-29999 less the node daemons' and our ports
  allow:                           # added to the built-in allowances, in every namespace:
    hostPaths: [/opt/models, {path: /scratch, readOnly: false}]  # read-only unless readOnly: false
    capabilities: [NET_ADMIN]      #   beside baseline's and IPC_LOCK, SYS_NICE, SYS_RESOURCE, SYS_PTRACE
    volumeTypes: [iscsi]           #   beside restricted's, nfs and image
    hostPorts: [9100]              #   beside trustZone.hostPorts
    hostNetwork: false             #   hostNetwork, hostPID, hostIPC: false unless said
  namespaces:                      # more in some namespaces, anchored as exceptions are
    - name: nccl-jobs              #   (namespace names, or a selector with a positive requirement)
      namespaces: [training]
      allow: {hostIPC: true, hostNetwork: true}
hostPaths:                         # earlier versions' host-path settings, still read:
  allow: [/run/xtables.lock]       #   each entry is a writable trustZone.allow.hostPaths entry;
  protect: [/srv/kubelet]          #   protect only names the root in messages (every path that is
                                   #   not allowed is refused on GPU nodes anyway)
dra:                               # Dynamic Resource Allocation claims (GPU011, docs/dra.md)
  gpuDrivers: [gpu.nvidia.com]     #   drivers whose devices are GPUs (this is the default)
  gpuClasses: [gpu.nvidia.com, mig.nvidia.com, vfio.gpu.nvidia.com]  # DeviceClasses that hand them out (default)
  claims:                          #   who may claim which GPU class (default: no tenant namespace),
    - name: ml-team                #   anchored to namespaces as exceptions are
      namespaces: [ml]
      classes: [gpu.nvidia.com]
  adminNamespaces: [gpu-ops]       #   where a claim may ask for adminAccess (beside Kubernetes'
                                   #   own label resource.kubernetes.io/admin-access=true)
usageLimits:                       # what the labeler does about a pod above its gpu-mem request on a
  - name: ml-batch                 #   shared card (docs/concepts/usage-limits.md); the first entry
    namespaces: [ml]               #   that matches decides, anchored as exceptions are; elsewhere
    mode: evict                    #   observe. observe: an Event on the pod; evict: the Event, then
    gracePeriodSeconds: 300        #   the Eviction API after this long above (default 300)
scheduler: gpushare                # the GPU scheduler in front of which this is the gate
                                   #   (policies.schedulers): gpushare | hami | volcano | koordinator
                                   #   | kai; or a mapping naming who writes its device annotations:
# scheduler:
#   profile: hami
#   writers:                         # service accounts, anchored to their namespace (default: the
#     - {namespace: kube-system, serviceAccount: hami-scheduler}  #   ones the scheduler's chart makes)
errorActions:                      # the most a crashing policy of each kind may do
  validate: enforce                # fail closed: an unchecked pod is not admitted
  mutate: warn                     # a crashing mutator must not block pods; it is reported
```

Actions: `enforce` denies (for a mutator: applies its patch), `warn` adds a warning (a mutator
only says what it would add), `audit` only records the result, `off` skips the policy. A crashing
policy gets the milder of its own action and `errorActions[kind]`, so an audited policy never
denies, not even when it crashes.

Resolution for one policy on one object (`Settings.action`, `Settings.exception`): an active
exception that matches skips it; otherwise the first namespace override that matches and names the
policy gives its action; otherwise `policies.<id>.action`; otherwise the policy's default.

Namespace labels come with the request (`model.Request.namespace_labels`). Where the caller does
not know them, only the label the apiserver puts on every namespace,
`kubernetes.io/metadata.name`, is assumed, so a selector on any other label does not match.
An exception with `expires` applies only when the caller says what time it is (`now`): without
a clock this package cannot tell whether it has expired, and applying it would be the unsafe guess.
"""

# CONTRACT (owned by the policies helper; keep these names and signatures):
#   Settings                       frozen dataclass, Settings() is the built-in default
#   from_mapping(data) -> Settings parses the already-loaded YAML document
#   InvalidSettings(ValueError)    raised with a one-line message naming the field
#   Settings.action(policy_id)     the action without namespace context, as before

from __future__ import annotations

import dataclasses
import datetime
import fnmatch
import functools
import re
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from policies import builtin, gpu, hostpaths, model, podspec, policy, schedulers, trustzone
from policies.gpu import dra
from policies.builtin import gpu105_scheduler_name

DEFAULT_EXEMPT_NAMESPACES: frozenset[str] = frozenset({"kube-system", "kube-node-lease", "gpu-admission"})
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the apiserver on every namespace
# NVIDIA_VISIBLE_DEVICES values that expose no device node: `void` (and empty) behave like runc,
# `none` mounts the driver but no card. Anything else could name cards, so it cannot be configured.
NEUTRAL_VISIBLE_DEVICES_CHOICES: tuple[str, ...] = ("void", "none", "")
# Well under the webhook's timeoutSeconds (5 in deploy/), so a request still gets an answer in time.
DEFAULT_USER_POLICY_BUDGET_S = 1.0
# The schedulerName the apiserver gives a pod that names none; deploy/scheduler-config.yaml extends it.
DEFAULT_SCHEDULER = gpu105_scheduler_name.DEFAULT_SCHEDULER
MAX_USER_POLICY_BUDGET_S = 30.0


# How many per-namespace action tables one Settings keeps (`Settings.actions_in`).
_ACTION_TABLES = 1024


class InvalidSettings(ValueError):
    """A settings document that cannot be used; the message is one line naming the field."""


def _default_actions() -> Mapping[str, model.Action]:
    return types.MappingProxyType({p.id: p.default_action for p in builtin.POLICIES})


def _default_error_actions() -> Mapping[model.PolicyKind, model.Action]:
    return types.MappingProxyType(
        {model.PolicyKind.VALIDATE: model.Action.ENFORCE, model.PolicyKind.MUTATE: model.Action.WARN}
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Requirement:
    """One `matchExpressions` entry of a label selector."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether `labels` satisfy the requirement (Kubernetes semantics: NotIn holds when absent)."""
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator == "In":
            return self.key in labels and labels[self.key] in self.values
        return self.key not in labels or labels[self.key] not in self.values


@dataclasses.dataclass(frozen=True, kw_only=True)
class LabelSelector:
    """A metav1.LabelSelector: every matchLabels pair and every requirement must hold."""

    match_labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    match_expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether `labels` are selected; an empty selector selects everything."""
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and all(
            r.matches(labels) for r in self.match_expressions
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class NamespaceMatch:
    """Namespaces by name (any of) and/or by labels; both given means both must hold."""

    names: frozenset[str] = frozenset()
    selector: LabelSelector | None = None

    def matches(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """Whether the namespace is matched."""
        if self.names and namespace not in self.names:
            return False
        return self.selector is None or self.selector.matches(labels)


@dataclasses.dataclass(frozen=True, kw_only=True)
class NamespaceOverride:
    """Actions for some policies in the namespaces an override matches."""

    name: str
    match: NamespaceMatch
    actions: Mapping[str, model.Action]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyException:
    """Objects some policies do not apply to, until `expires` (when set)."""

    name: str
    policies: frozenset[str]
    namespaces: NamespaceMatch | None = None
    names: tuple[str, ...] = ()  # shell patterns; any of them
    object_selector: LabelSelector | None = None
    expires: datetime.datetime | None = None  # aware, UTC
    reason: str = ""

    def expired(self, now: datetime.datetime) -> bool:
        """Whether the exception has stopped applying at `now`."""
        return self.expires is not None and _aware(now) >= self.expires

    def matches(self, *, namespace: str, namespace_labels: Mapping[str, str], obj: Mapping[str, Any]) -> bool:
        """Whether the object falls under the exception (expiry is not considered here)."""
        if self.namespaces is not None and not self.namespaces.matches(namespace, namespace_labels):
            return False
        metadata = _mapping(obj.get("metadata"))
        if self.names:
            name = metadata.get("name") or ""
            if not name:
                generate = metadata.get("generateName")
                name = f"{generate}*" if isinstance(generate, str) and generate else ""
            if not isinstance(name, str) or not any(_glob(name, p) for p in self.names):
                return False
        if self.object_selector is not None:
            candidates = [_labels(metadata.get("labels"))]
            template = _mapping(_mapping(_mapping(obj.get("spec")).get("template")).get("metadata"))
            jobs = _mapping(_mapping(_mapping(_mapping(obj.get("spec")).get("jobTemplate")).get("spec")).get("template"))
            for found in (template, _mapping(jobs.get("metadata"))):
                if "labels" in found:
                    candidates.append(_labels(found.get("labels")))
            if not any(self.object_selector.matches(c) for c in candidates):
                return False
        return True


@dataclasses.dataclass(frozen=True, kw_only=True)
class ZoneAllowance:
    """More of what pods that can reach a GPU node may have, in the namespaces `match` selects."""

    name: str
    match: NamespaceMatch
    allowance: trustzone.Allowance


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClaimGrant:
    """GPU DeviceClasses the namespaces `match` selects may claim through DRA."""

    name: str
    match: NamespaceMatch
    classes: frozenset[str]


USAGE_OBSERVE = "observe"  # usageLimits modes: an Event when a pod goes above its request and back
USAGE_EVICT = "evict"  # the Event, then the Eviction API after the grace period
USAGE_MODES = (USAGE_OBSERVE, USAGE_EVICT)
DEFAULT_USAGE_GRACE_S = 300


@dataclasses.dataclass(frozen=True, kw_only=True)
class UsageLimit:
    """`usageLimits`: what the labeler does about pods above their request in the namespaces `match` selects."""

    name: str
    match: NamespaceMatch
    mode: str = USAGE_OBSERVE
    grace_s: int = DEFAULT_USAGE_GRACE_S


DEFAULT_USAGE_LIMIT = UsageLimit(name="default", match=NamespaceMatch(), mode=USAGE_OBSERVE)


DEFAULT_GPU_CLASSES = frozenset({"gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com"})


@dataclasses.dataclass(frozen=True, kw_only=True)
class DraSettings:
    """`dra`: which drivers and DeviceClasses hand out GPUs, who may claim them, where adminAccess goes."""

    gpu_drivers: tuple[str, ...] = (dra.NVIDIA_DRIVER,)
    gpu_classes: frozenset[str] = DEFAULT_GPU_CLASSES
    claims: tuple[ClaimGrant, ...] = ()
    admin_namespaces: frozenset[str] = frozenset()

    def may_claim(self, class_name: str, *, namespace: str, namespace_labels: Mapping[str, str] | None = None) -> bool:
        """Whether `namespace` may claim devices of the GPU class `class_name`."""
        labels = labels_of_namespace(namespace, namespace_labels)
        return any(class_name in g.classes and g.match.matches(namespace, labels) for g in self.claims)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything the engine can be told; the defaults are the documented built-in behaviour."""

    actions: Mapping[str, model.Action] = dataclasses.field(default_factory=_default_actions)
    exempt_namespaces: frozenset[str] = DEFAULT_EXEMPT_NAMESPACES
    default_shared_mode: gpu.Mode = gpu.Mode.CGPU
    gpu_scheduler_name: str = ""
    # The schedulers that call the scheduler extender (GPU008); see `extender_schedulers`.
    extender_scheduler_names: tuple[str, ...] = (DEFAULT_SCHEDULER,)
    keep_non_gpu_pods_off_gpu_nodes: bool = False
    error_actions: Mapping[model.PolicyKind, model.Action] = dataclasses.field(
        default_factory=_default_error_actions
    )
    visible_devices_neutral_value: str = gpu.VISIBLE_DEVICES_VOID
    user_policy_budget_s: float = DEFAULT_USER_POLICY_BUDGET_S
    namespace_overrides: tuple[NamespaceOverride, ...] = ()
    exceptions: tuple[PolicyException, ...] = ()
    # The trust zone (`trustZone`): which pods can reach a GPU node, and what they may have there.
    trust_zone: trustzone.TrustZone = trustzone.DEFAULT_ZONE
    zone_allowance: trustzone.Allowance = trustzone.DEFAULT_ALLOWANCE
    zone_namespaces: tuple[ZoneAllowance, ...] = ()
    # Validators from outside the built-ins (compiled CEL policies, see policies.cel), evaluated
    # after the built-in validators by every caller of the engine.
    user_policies: tuple[policy.Policy, ...] = ()
    # GPU003's protected roots and allowed host paths (`hostPaths`).
    host_paths: hostpaths.HostPathRules = hostpaths.DEFAULT_RULES
    dra: DraSettings = DraSettings()
    # What the labeler does about pods above their GPU memory request (`usageLimits`).
    usage_limits: tuple[UsageLimit, ...] = ()

    def usage_limit(self, namespace: str, namespace_labels: Mapping[str, str] | None = None) -> UsageLimit:
        """The first `usageLimits` entry that matches the namespace, else observe (DEFAULT_USAGE_LIMIT)."""
        labels = labels_of_namespace(namespace, namespace_labels)
        for entry in self.usage_limits:
            if entry.match.matches(namespace, labels):
                return entry
        return DEFAULT_USAGE_LIMIT
    # The GPU scheduler this is the gate in front of (`scheduler`) and its trusted writers.
    scheduler: schedulers.Scheduler = schedulers.DEFAULT_SCHEDULER
    # True in the settings that judge objects as stored (`for_stored_objects`: audit, explain); how
    # the settings are used, not what they say, so it takes no part in comparing them.
    stored_objects: bool = dataclasses.field(default=False, compare=False)

    def action(
        self,
        policy_id: str,
        *,
        namespace: str | None = None,
        namespace_labels: Mapping[str, str] | None = None,
    ) -> model.Action:
        """The action of a policy: a matching namespace override, else the configured, else the default.

        Without `namespace` no override is considered (the cluster-wide action).
        """
        if namespace is not None and self.namespace_overrides:
            labels = labels_of_namespace(namespace, namespace_labels)
            for override in self.namespace_overrides:
                if policy_id in override.actions and override.match.matches(namespace, labels):
                    return override.actions[policy_id]
        found = self.actions.get(policy_id)
        if found is not None:
            return found
        for item in (*builtin.POLICIES, *self.user_policies):
            if item.id == policy_id:
                return item.default_action
        return model.Action.OFF

    def actions_in(
        self, namespace: str | None = None, namespace_labels: Mapping[str, str] | None = None
    ) -> Mapping[str, model.Action]:
        """`action` of every built-in, user policy and configured id in one namespace, as one table.

        The engine asks for each policy's action on every request; the table is worked out once per
        namespace and labels (one table for all namespaces when there are no namespace overrides)
        and kept on these settings, which never change, so a new settings version starts afresh. At
        most `_ACTION_TABLES` tables are kept; past that the oldest are dropped. An id not in the
        table is asked of `action` (it is OFF there unless configured).
        """
        tables = self._action_tables
        if namespace is None or not self.namespace_overrides:
            key: object = None
        else:
            try:
                key = (namespace, frozenset(namespace_labels.items()) if namespace_labels else frozenset())
            except TypeError:  # an unhashable label value: answer without keeping the table
                return self._action_table(namespace, namespace_labels)
        found = tables.get(key)
        if found is None:
            found = self._action_table(namespace if key is not None else None, namespace_labels)
            if len(tables) >= _ACTION_TABLES:
                for stale in list(tables)[: _ACTION_TABLES // 2]:
                    tables.pop(stale, None)
            tables[key] = found
        return found

    def _action_table(self, namespace: str | None, namespace_labels: Mapping[str, str] | None) -> Mapping[str, model.Action]:
        ids = dict.fromkeys([*(p.id for p in builtin.POLICIES), *(p.id for p in self.user_policies), *self.actions])
        return {policy_id: self.action(policy_id, namespace=namespace, namespace_labels=namespace_labels) for policy_id in ids}

    @functools.cached_property
    def _action_tables(self) -> dict[object, Mapping[str, model.Action]]:
        return {}

    def switched_off(self, policy_ids: Iterable[str]) -> Settings:
        """These settings with the named policies off everywhere: no namespace override turns them back on."""
        off = frozenset(policy_ids)
        actions = {**self.actions, **{policy_id: model.Action.OFF for policy_id in off}}
        overrides = tuple(
            dataclasses.replace(o, actions={k: v for k, v in o.actions.items() if k not in off})
            for o in self.namespace_overrides
        )
        return dataclasses.replace(self, actions=actions, namespace_overrides=overrides)

    def for_stored_objects(self) -> Settings:
        """Settings to judge an object as stored (audit, explain): the validators that judge what a
        request writes rather than the object (GPU008: a bound pod carries nodeName and the
        extender's allocation by design) are off."""
        off = self.switched_off(p.id for p in builtin.POLICIES if not p.stored_objects)
        return dataclasses.replace(off, stored_objects=True)

    @functools.cached_property
    def without_mutators(self) -> Settings:
        """These settings with every built-in mutator off: a pod judged as stored (the validating
        webhook), where what the mutators would add must already be there."""
        return self.switched_off(p.id for p in builtin.POLICIES if isinstance(p, policy.Mutator))

    def exception(
        self,
        policy_id: str,
        *,
        namespace: str,
        namespace_labels: Mapping[str, str] | None = None,
        obj: Mapping[str, Any],
        now: datetime.datetime | None,
    ) -> PolicyException | None:
        """The first active exception that exempts `obj` from the policy, or None."""
        labels = labels_of_namespace(namespace, namespace_labels)
        for exception in self.exceptions:
            if policy_id not in exception.policies:
                continue
            if exception.expires is not None and (now is None or exception.expired(now)):
                continue
            if exception.matches(namespace=namespace, namespace_labels=labels, obj=obj):
                return exception
        return None

    @functools.cached_property  # read on every GPU008 review; a frozen instance never changes
    def extender_schedulers(self) -> frozenset[str]:
        """The schedulerNames GPU008 accepts on pods asking for extender-managed resources: the
        configured ones (default `default-scheduler`) and always `gpuSchedulerName`, where GPU105
        sends such pods."""
        names = set(self.extender_scheduler_names)
        if self.gpu_scheduler_name:
            names.add(self.gpu_scheduler_name)
        return frozenset(names)

    def allowance(self, namespace: str, namespace_labels: Mapping[str, str] | None = None) -> trustzone.Allowance:
        """What a pod that can reach a GPU node may have in `namespace`: the cluster's allowances and
        those of every `trustZone.namespaces` entry that matches it."""
        found = self.zone_allowance
        if self.zone_namespaces:
            labels = labels_of_namespace(namespace, namespace_labels)
            for entry in self.zone_namespaces:
                if entry.match.matches(namespace, labels):
                    found = found.widened(entry.allowance)
        return found

    @functools.cached_property
    def widest_allowance(self) -> trustzone.Allowance:
        """The allowances of every namespace together (for exports that cannot tell namespaces apart)."""
        found = self.zone_allowance
        for entry in self.zone_namespaces:
            found = found.widened(entry.allowance)
        return found

    def error_action(self, kind: model.PolicyKind) -> model.Action:
        """The most a crashing policy of this kind may do."""
        return self.error_actions.get(kind, model.Action.ENFORCE)

    def is_neutral_visible_devices(self, value: object) -> bool:
        """Whether an NVIDIA_VISIBLE_DEVICES value exposes no card: void, none or the configured value."""
        return gpu.is_safe_visible_devices(value) or (
            isinstance(value, str) and value.strip().lower() == self.visible_devices_neutral_value
        )


def labels_of_namespace(namespace: str, labels: Mapping[str, str] | None) -> Mapping[str, str]:
    """The namespace's labels, with the name label the apiserver always sets."""
    if labels is not None and labels.get(NAMESPACE_NAME_LABEL) == namespace:
        return labels
    return {**(labels or {}), NAMESPACE_NAME_LABEL: namespace}


def labels_by_namespace(objects: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """The labels of every Namespace object among `objects`, by name (others are ignored)."""
    found: dict[str, dict[str, str]] = {}
    for obj in objects:
        metadata = obj.get("metadata")
        if obj.get("kind") != "Namespace" or not isinstance(metadata, Mapping) or not isinstance(metadata.get("name"), str):
            continue
        labels = metadata.get("labels")
        found[metadata["name"]] = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {}
    return found


def expired_exceptions(settings: Settings, *, now: datetime.datetime) -> list[PolicyException]:
    """The exceptions whose `expires` has passed at `now` (audit reports them as findings)."""
    return [e for e in settings.exceptions if e.expired(now)]


# --- parsing ---------------------------------------------------------------------------------------

_KEYS = (
    "policies",
    "namespaceOverrides",
    "exceptions",
    "exemptNamespaces",
    "defaultSharedMode",
    "gpuSchedulerName",
    "extenderSchedulers",
    "visibleDevicesNeutralValue",
    "userPolicyBudgetSeconds",
    "keepNonGpuPodsOffGpuNodes",
    "trustZone",
    "hostPaths",
    "errorActions",
    "dra",
    "usageLimits",
    "scheduler",
)
_ACTION_NAMES = ", ".join(model.Action)
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # a namespace name (DNS label)


def _action(value: object, *, field: str) -> model.Action:
    if value is False:  # YAML 1.1: a bare `off` loads as false
        return model.Action.OFF
    if isinstance(value, str):
        try:
            return model.Action(value.strip().lower())
        except ValueError:
            pass
    raise InvalidSettings(f"{field}: must be one of {_ACTION_NAMES}, got {value!r}")


def _policy_actions(value: object, *, field: str, known: Sequence[str]) -> dict[str, model.Action]:
    if not isinstance(value, Mapping):
        raise InvalidSettings(f"{field}: must be a mapping of policy ID to {{action: ...}}, got {value!r}")
    actions: dict[str, model.Action] = {}
    for policy_id, entry in value.items():
        if policy_id not in known:
            raise InvalidSettings(f"{field}.{policy_id}: unknown policy; known: {', '.join(known)}")
        if not isinstance(entry, Mapping):
            raise InvalidSettings(f"{field}.{policy_id}: must be a mapping like {{action: enforce}}, got {entry!r}")
        for key in entry:
            if key != "action":
                raise InvalidSettings(f"{field}.{policy_id}.{key}: unknown key; known: action")
        if "action" in entry:
            actions[policy_id] = _action(entry["action"], field=f"{field}.{policy_id}.action")
    return actions


def _policies(value: object, *, defaults: Mapping[str, model.Action]) -> Mapping[str, model.Action]:
    actions = dict(defaults)
    if value is not None:
        actions.update(_policy_actions(value, field="policies", known=sorted(defaults)))
    return types.MappingProxyType(actions)


def _error_actions(value: object) -> Mapping[model.PolicyKind, model.Action]:
    actions = dict(_default_error_actions())
    if value is None:
        return types.MappingProxyType(actions)
    if not isinstance(value, Mapping):
        raise InvalidSettings(f"errorActions: must be a mapping with validate and mutate, got {value!r}")
    for key, entry in value.items():
        try:
            kind = model.PolicyKind(key)
        except ValueError:
            raise InvalidSettings(f"errorActions.{key}: unknown key; known: validate, mutate") from None
        actions[kind] = _action(entry, field=f"errorActions.{key}")
    return types.MappingProxyType(actions)


def _namespaces(value: object) -> frozenset[str]:
    if value is None:
        return DEFAULT_EXEMPT_NAMESPACES
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise InvalidSettings(f"exemptNamespaces: must be a list of namespace names, got {value!r}")
    return frozenset(value)


def _shared_mode(value: object) -> gpu.Mode:
    if value is None:
        return gpu.Mode.CGPU
    choices = ", ".join(gpu.DEFAULT_SHARED_MODE_CHOICES)
    if isinstance(value, str) and value in gpu.DEFAULT_SHARED_MODE_CHOICES:
        return gpu.Mode(value)
    raise InvalidSettings(f"defaultSharedMode: must be one of {choices}, got {value!r}")


def _scheduler_name(value: object) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidSettings(f"gpuSchedulerName: must be a string, got {value!r}")
    return value.strip()


def _extender_schedulers(value: object) -> tuple[str, ...]:
    if value is None:
        return (DEFAULT_SCHEDULER,)
    names = _strings(value, field="extenderSchedulers", allow_empty_list=True)
    if not all(name.strip() for name in names):
        raise InvalidSettings(f"extenderSchedulers: must be a list of non-empty strings, got {value!r}")
    return tuple(dict.fromkeys(name.strip() for name in names))


def _neutral_value(value: object) -> str:
    if value is None:
        return gpu.VISIBLE_DEVICES_VOID
    if isinstance(value, str) and value.strip().lower() in NEUTRAL_VISIBLE_DEVICES_CHOICES:
        return value.strip().lower()
    choices = ", ".join(repr(c) for c in NEUTRAL_VISIBLE_DEVICES_CHOICES)
    raise InvalidSettings(
        f"visibleDevicesNeutralValue: must be one of {choices} (values that expose no GPU), got {value!r}"
    )


def _budget(value: object) -> float:
    if value is None:
        return DEFAULT_USER_POLICY_BUDGET_S
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_USER_POLICY_BUDGET_S:
        raise InvalidSettings(
            f"userPolicyBudgetSeconds: must be a number of seconds above 0 and at most {MAX_USER_POLICY_BUDGET_S:g}, "
            f"got {value!r}"
        )
    return float(value)


def _flag(value: object, *, field: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidSettings(f"{field}: must be true or false, got {value!r}")
    return value


def _keys(value: Mapping[str, Any], *, field: str, known: Sequence[str]) -> None:
    for key in value:
        if key not in known:
            raise InvalidSettings(f"{field}.{key}: unknown key; known: {', '.join(known)}")


def _entries(
    value: object, *, field: str, known: Sequence[str], shape: str = "a mapping"
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each entry of a list of mappings with only `known` keys, and the field that names it."""
    if not isinstance(value, list):
        raise InvalidSettings(f"{field}: must be a list, got {value!r}")
    for index, entry in enumerate(value):
        where = f"{field}[{index}]"
        if not isinstance(entry, Mapping):
            raise InvalidSettings(f"{where}: must be {shape}, got {entry!r}")
        _keys(entry, field=where, known=known)
        yield where, entry


def _strings(value: object, *, field: str, allow_empty_list: bool = False) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise InvalidSettings(f"{field}: must be a list of non-empty strings, got {value!r}")
    if not value and not allow_empty_list:
        raise InvalidSettings(f"{field}: must not be empty")
    return tuple(value)


def _namespace_names(value: object, *, field: str) -> frozenset[str]:
    names = _strings(value, field=field)
    for index, name in enumerate(names):
        if not _NAME.match(name) or len(name) > 63:
            raise InvalidSettings(f"{field}[{index}]: {name!r} is not a namespace name")
    return frozenset(names)


def label_selector(value: object, *, field: str) -> LabelSelector:
    """A metav1.LabelSelector from its YAML form; raises InvalidSettings naming the field."""
    if not isinstance(value, Mapping):
        raise InvalidSettings(f"{field}: must be a mapping with matchLabels and/or matchExpressions, got {value!r}")
    _keys(value, field=field, known=("matchLabels", "matchExpressions"))
    labels = value.get("matchLabels") or {}
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise InvalidSettings(f"{field}.matchLabels: must map label keys to string values, got {labels!r}")
    requirements = []
    for where, entry in _entries(
        value.get("matchExpressions") or [],
        field=f"{field}.matchExpressions",
        known=("key", "operator", "values"),
        shape="a mapping with key, operator and values",
    ):
        key, operator, values = entry.get("key"), entry.get("operator"), entry.get("values") or []
        if not isinstance(key, str) or not key:
            raise InvalidSettings(f"{where}.key: must be a label key, got {key!r}")
        if operator not in _OPERATORS:
            raise InvalidSettings(f"{where}.operator: must be one of {', '.join(_OPERATORS)}, got {operator!r}")
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise InvalidSettings(f"{where}.values: must be a list of strings, got {values!r}")
        if operator in ("In", "NotIn") and not values:
            raise InvalidSettings(f"{where}.values: must not be empty for {operator}")
        if operator in ("Exists", "DoesNotExist") and values:
            raise InvalidSettings(f"{where}.values: must be empty for {operator}")
        requirements.append(Requirement(key=key, operator=operator, values=frozenset(values)))
    return LabelSelector(match_labels=types.MappingProxyType(dict(labels)), match_expressions=tuple(requirements))


def _namespace_match(value: Mapping[str, Any], *, field: str) -> NamespaceMatch | None:
    names = value.get("namespaces")
    selector = value.get("namespaceSelector")
    if names is None and selector is None:
        return None
    return NamespaceMatch(
        names=frozenset() if names is None else _namespace_names(names, field=f"{field}.namespaces"),
        selector=None if selector is None else label_selector(selector, field=f"{field}.namespaceSelector"),
    )


def _override_list(value: object, *, known: Sequence[str]) -> tuple[NamespaceOverride, ...]:
    if value is None:
        return ()
    overrides = []
    for field, entry in _entries(
        value, field="namespaceOverrides", known=("name", "namespaces", "namespaceSelector", "policies")
    ):
        name = entry.get("name", field)
        if not isinstance(name, str) or not name:
            raise InvalidSettings(f"{field}.name: must be a non-empty string, got {name!r}")
        match = _namespace_match(entry, field=field)
        if match is None:
            raise InvalidSettings(f"{field}: needs namespaces and/or namespaceSelector")
        if "policies" not in entry:
            raise InvalidSettings(f"{field}.policies: is required")
        actions = _policy_actions(entry["policies"], field=f"{field}.policies", known=known)
        overrides.append(NamespaceOverride(name=name, match=match, actions=types.MappingProxyType(actions)))
    return tuple(overrides)


def _timestamp(value: object, *, field: str) -> datetime.datetime:
    if isinstance(value, datetime.datetime):
        return _aware(value)
    if isinstance(value, datetime.date):  # YAML reads a bare 2026-12-31 as a date
        return datetime.datetime(value.year, value.month, value.day, tzinfo=datetime.timezone.utc)
    if isinstance(value, str):
        try:
            return _aware(datetime.datetime.fromisoformat(value.strip()))
        except ValueError:
            pass
    raise InvalidSettings(f"{field}: must be an RFC 3339 time like 2026-12-31T00:00:00Z, got {value!r}")


def _anchored(namespaces: NamespaceMatch | None, *, field: str, name: str, what: str = "exception") -> None:
    """Refuse an exception a pod's author could match: one not tied to namespaces tenants cannot label.

    `names` and `objectSelector` are written by whoever writes the pod, so on their own they let a
    tenant label a pod into the exception. Namespace names, or a namespaceSelector with at least one
    positive requirement (a matchLabels pair, In or Exists), anchor it; NotIn and DoesNotExist alone
    select every namespace that lacks a label, new tenant namespaces included, and Exists on
    `kubernetes.io/metadata.name` (which every namespace has) selects them all.
    """
    selector = None if namespaces is None else namespaces.selector
    positive = selector is not None and (
        bool(selector.match_labels)
        or any(
            r.operator == "In" or (r.operator == "Exists" and r.key != NAMESPACE_NAME_LABEL)
            for r in selector.match_expressions
        )
    )
    if namespaces is not None and (namespaces.names or positive):
        return
    where = "match." if what == "exception" else ""
    raise InvalidSettings(
        f"{field}: {what} {name!r} is not anchored to namespaces: give {where}namespaces, or a "
        f"{where}namespaceSelector with matchLabels, In or Exists (names and objectSelector are set by the "
        "pod's author, so they may only narrow an exception within its namespaces)"
    )


def _exception_list(value: object, *, known: Sequence[str]) -> tuple[PolicyException, ...]:
    if value is None:
        return ()
    exceptions: list[PolicyException] = []
    for field, entry in _entries(value, field="exceptions", known=("name", "policies", "match", "expires", "reason")):
        name = entry.get("name")
        if not isinstance(name, str) or not name.strip():
            raise InvalidSettings(f"{field}.name: is required (a non-empty string), got {name!r}")
        if any(e.name == name for e in exceptions):
            raise InvalidSettings(f"{field}.name: {name!r} is used by an earlier exception")
        ids = _strings(entry.get("policies"), field=f"{field}.policies")
        for position, policy_id in enumerate(ids):
            if policy_id not in known:
                raise InvalidSettings(
                    f"{field}.policies[{position}]: unknown policy {policy_id!r}; known: {', '.join(known)}"
                )
        match = entry.get("match")
        if not isinstance(match, Mapping) or not match:
            raise InvalidSettings(
                f"{field}.match: is required: namespaces, namespaceSelector, names and/or objectSelector"
            )
        _keys(match, field=f"{field}.match", known=("namespaces", "namespaceSelector", "names", "objectSelector"))
        names = () if match.get("names") is None else _strings(match["names"], field=f"{field}.match.names")
        selector = match.get("objectSelector")
        namespaces = _namespace_match(match, field=f"{field}.match")
        _anchored(namespaces, field=f"{field}.match", name=name.strip())
        reason = entry.get("reason", "")
        if not isinstance(reason, str):
            raise InvalidSettings(f"{field}.reason: must be a string, got {reason!r}")
        expires = entry.get("expires")
        exceptions.append(
            PolicyException(
                name=name.strip(),
                policies=frozenset(ids),
                namespaces=namespaces,
                names=names,
                object_selector=None
                if selector is None
                else label_selector(selector, field=f"{field}.match.objectSelector"),
                expires=None if expires is None else _timestamp(expires, field=f"{field}.expires"),
                reason=reason,
            )
        )
    return tuple(exceptions)


def _host_paths(value: object) -> hostpaths.HostPathRules:
    if value is None:
        return hostpaths.DEFAULT_RULES
    if not isinstance(value, Mapping):
        raise InvalidSettings(f"hostPaths: must be a mapping with protect and/or allow, got {value!r}")
    _keys(value, field="hostPaths", known=("protect", "allow"))
    lists = {
        key: () if value.get(key) is None else _strings(value[key], field=f"hostPaths.{key}", allow_empty_list=True)
        for key in ("protect", "allow")
    }
    try:
        return hostpaths.configured(protect=lists["protect"], allow=lists["allow"])
    except ValueError as error:
        raise InvalidSettings(f"hostPaths.{error}") from None


_ALLOW_KEYS = ("hostPaths", "capabilities", "volumeTypes", "hostPorts", *trustzone.HOST_NAMESPACES)
_ZONE_KEYS = ("strict", "gpuResources", "gpuNodeTaints", "gpuNodeLabels", "hostPorts", "allow", "namespaces")
# Kubernetes label syntax (apimachinery validation IsQualifiedName, IsValidLabelValue).
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


def _label_key(key: object, *, field: str) -> str:
    if not isinstance(key, str):
        raise InvalidSettings(f"{field}: must be a label key, got {key!r}")
    prefix, _, name = key.rpartition("/")
    if not _LABEL_NAME.match(name) or ("/" in key and (not prefix or len(prefix) > 253 or not _LABEL_PREFIX.match(prefix))):
        raise InvalidSettings(f"{field}: {key!r} is not a valid label key ([prefix/]name, name up to 63 characters)")
    return key


def _gpu_node_labels(value: object, *, field: str) -> tuple[trustzone.NodeLabel, ...]:
    """`trustZone.gpuNodeLabels`: label keys (any value marks a GPU node) or {key, values}."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidSettings(f"{field}: must be a list of label keys or {{key: ..., values: [...]}}, got {value!r}")
    found: list[trustzone.NodeLabel] = []
    for index, entry in enumerate(value):
        where = f"{field}[{index}]"
        if isinstance(entry, str):
            entry = {"key": entry}
        if not isinstance(entry, Mapping):
            raise InvalidSettings(f"{where}: must be a label key or {{key: ..., values: [...]}}, got {entry!r}")
        _keys(entry, field=where, known=("key", "values"))
        key = _label_key(entry.get("key"), field=f"{where}.key")
        values = _strings(entry["values"], field=f"{where}.values") if entry.get("values") is not None else ()
        for position, item in enumerate(values):
            if not _LABEL_VALUE.match(item):
                raise InvalidSettings(f"{where}.values[{position}]: {item!r} is not a valid label value (up to 63 characters)")
        found.append(trustzone.NodeLabel(key=key, values=values, source="the settings (trustZone.gpuNodeLabels)"))
    return tuple(found)


def _host_ports(value: object, *, field: str) -> tuple[trustzone.PortRange, ...]:
    """A list of host ports and ranges (`8888`, `"8000-8999"`)."""
    if not isinstance(value, list):
        raise InvalidSettings(f"{field}: must be a list of ports and ranges (8888, \"8000-8999\"), got {value!r}")
    found: list[trustzone.PortRange] = []
    for index, entry in enumerate(value):
        where = f"{field}[{index}]"
        low: object
        high: object
        if isinstance(entry, int) and not isinstance(entry, bool):
            low = high = entry
        elif isinstance(entry, str) and re.fullmatch(r"\d+(-\d+)?", entry.strip()):
            first, _, last = entry.strip().partition("-")
            low, high = int(first), int(last or first)
        else:
            raise InvalidSettings(f"{where}: must be a port or a range \"LOW-HIGH\", got {entry!r}")
        assert isinstance(low, int) and isinstance(high, int)
        if not (1 <= low <= 65535 and 1 <= high <= 65535):
            raise InvalidSettings(f"{where}: {entry!r} is not within 1-65535")
        if low > high:
            raise InvalidSettings(f"{where}: {entry!r} is upside down (the first port must not be above the last)")
        found.append(trustzone.PortRange(low=low, high=high))
    return tuple(found)
_RESOURCE_NAME = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _allowed_host_path(entry: object, *, field: str) -> trustzone.HostPath:
    if isinstance(entry, str):
        entry = {"path": entry}
    if not isinstance(entry, Mapping):
        raise InvalidSettings(f"{field}: must be an absolute path or {{path: ..., readOnly: false}}, got {entry!r}")
    _keys(entry, field=field, known=("path", "readOnly", "reason"))
    path = entry.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        raise InvalidSettings(f"{field}.path: must be an absolute path, got {path!r}")
    resolved = hostpaths.resolve(path)
    if resolved == "/":
        raise InvalidSettings(f"{field}.path: {path!r} is the node's whole filesystem; give the namespaces that need it an exception")
    read_only = entry.get("readOnly", True)
    if not isinstance(read_only, bool):
        raise InvalidSettings(f"{field}.readOnly: must be true or false, got {read_only!r}")
    reason = entry.get("reason", "")
    if not isinstance(reason, str):
        raise InvalidSettings(f"{field}.reason: must be a string, got {reason!r}")
    return trustzone.HostPath(path=resolved, read_only=read_only, reason=reason or "allowed by the settings")


def _allow(value: object, *, field: str) -> trustzone.Allowance:
    """The additions of one `allow` mapping, as an Allowance holding only them."""
    if value is None:
        return trustzone.Allowance(capabilities=frozenset(), host_paths=(), volume_types=frozenset(), host_ports=())
    if not isinstance(value, Mapping):
        raise InvalidSettings(f"{field}: must be a mapping with {', '.join(_ALLOW_KEYS)}, got {value!r}")
    _keys(value, field=field, known=_ALLOW_KEYS)
    paths = value.get("hostPaths") or []
    if not isinstance(paths, list):
        raise InvalidSettings(f"{field}.hostPaths: must be a list, got {paths!r}")
    capabilities = _strings(value.get("capabilities") or [], field=f"{field}.capabilities", allow_empty_list=True)
    names = frozenset(podspec.capability_name(c) for c in capabilities)
    if "ALL" in names or "SYS_ADMIN" in names:
        raise InvalidSettings(
            f"{field}.capabilities: ALL and SYS_ADMIN cannot be allowed (the NVIDIA toolkit treats SYS_ADMIN as "
            "privileged); give the namespaces that need them an exception"
        )
    types_ = _strings(value.get("volumeTypes") or [], field=f"{field}.volumeTypes", allow_empty_list=True)
    if "hostPath" in types_:
        raise InvalidSettings(f"{field}.volumeTypes: hostPath volumes are allowed by path (hostPaths), not as a type")
    namespaces = frozenset(name for name in trustzone.HOST_NAMESPACES if _flag(value.get(name), field=f"{field}.{name}"))
    ports = value.get("hostPorts")
    return trustzone.Allowance(
        capabilities=names,
        host_paths=tuple(_allowed_host_path(p, field=f"{field}.hostPaths[{i}]") for i, p in enumerate(paths)),
        volume_types=frozenset(types_),
        host_namespaces=namespaces,
        host_ports=() if ports is None else _host_ports(ports, field=f"{field}.hostPorts"),
    )


def _zone(value: object, legacy: object) -> tuple[trustzone.TrustZone, trustzone.Allowance, tuple[ZoneAllowance, ...]]:
    legacy_paths = tuple(
        trustzone.HostPath(path=p, read_only=False, reason="allowed by the settings (hostPaths.allow)")
        for p in _legacy_allow(legacy)
    )
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise InvalidSettings(f"trustZone: must be a mapping with {', '.join(_ZONE_KEYS)}, got {value!r}")
    _keys(value, field="trustZone", known=_ZONE_KEYS)
    resources = _strings(value.get("gpuResources") or [], field="trustZone.gpuResources", allow_empty_list=True)
    for index, name in enumerate(resources):
        if not _RESOURCE_NAME.match(name.removesuffix("*").rstrip("-_.") or "-"):
            raise InvalidSettings(f"trustZone.gpuResources[{index}]: {name!r} is not a resource name (a trailing * is a prefix)")
    zone = trustzone.TrustZone(
        strict=_flag(value.get("strict"), field="trustZone.strict"),
        gpu_resources=resources,
        gpu_node_taints=_strings(value.get("gpuNodeTaints") or [], field="trustZone.gpuNodeTaints", allow_empty_list=True),
        gpu_node_labels=_gpu_node_labels(value.get("gpuNodeLabels"), field="trustZone.gpuNodeLabels"),
    )
    added = _allow(value.get("allow"), field="trustZone.allow")
    added = dataclasses.replace(added, host_paths=(*added.host_paths, *legacy_paths))
    allowance = trustzone.DEFAULT_ALLOWANCE
    if value.get("hostPorts") is not None:
        allowance = dataclasses.replace(allowance, host_ports=_host_ports(value["hostPorts"], field="trustZone.hostPorts"))
    allowance = allowance.widened(added)
    entries: list[ZoneAllowance] = []
    for field, entry in _entries(
        value.get("namespaces") or [], field="trustZone.namespaces", known=("name", "namespaces", "namespaceSelector", "allow")
    ):
        name, match = _anchored_entry(entry, field=field)
        entries.append(ZoneAllowance(name=name, match=match, allowance=_allow(entry.get("allow"), field=f"{field}.allow")))
    return zone, allowance, tuple(entries)


def _anchored_entry(entry: Mapping[str, Any], *, field: str) -> tuple[str, NamespaceMatch]:
    """An entry's name and the namespaces it is anchored to (trustZone.namespaces, dra.claims)."""
    name = entry.get("name", field)
    if not isinstance(name, str) or not name:
        raise InvalidSettings(f"{field}.name: must be a non-empty string, got {name!r}")
    match = _namespace_match(entry, field=field)
    _anchored(match, field=field, name=name, what="entry")
    assert match is not None  # _anchored refuses None
    return name, match


def _dra(value: object) -> DraSettings:
    if value is None:
        return DraSettings()
    if not isinstance(value, Mapping):
        raise InvalidSettings(f"dra: must be a mapping with gpuDrivers, gpuClasses, claims, adminNamespaces; got {value!r}")
    _keys(value, field="dra", known=("gpuDrivers", "gpuClasses", "claims", "adminNamespaces"))
    grants: list[ClaimGrant] = []
    for field, entry in _entries(value.get("claims") or [], field="dra.claims", known=("name", "namespaces", "namespaceSelector", "classes")):
        name, match = _anchored_entry(entry, field=field)
        grants.append(ClaimGrant(name=name, match=match, classes=frozenset(_strings(entry.get("classes"), field=f"{field}.classes"))))
    admins = value.get("adminNamespaces")
    return DraSettings(
        gpu_drivers=_strings(value["gpuDrivers"], field="dra.gpuDrivers") if "gpuDrivers" in value else (dra.NVIDIA_DRIVER,),
        gpu_classes=frozenset(_strings(value["gpuClasses"], field="dra.gpuClasses")) if "gpuClasses" in value else DEFAULT_GPU_CLASSES,
        claims=tuple(grants),
        admin_namespaces=frozenset() if admins is None else _namespace_names(admins, field="dra.adminNamespaces"),
    )


def usage_limits_of(data: Mapping[str, Any] | None) -> tuple[UsageLimit, ...]:
    """Only the `usageLimits` of a settings document (what the labeler reads of the same file; the
    rest is the webhook's and may name user policies the labeler does not load)."""
    if data is not None and not isinstance(data, Mapping):
        raise InvalidSettings(f"settings: must be a mapping, got {type(data).__name__}")
    return _usage_limits((data or {}).get("usageLimits"))


def _usage_limits(value: object) -> tuple[UsageLimit, ...]:
    if value is None:
        return ()
    found: list[UsageLimit] = []
    known = ("name", "namespaces", "namespaceSelector", "mode", "gracePeriodSeconds")
    for field, entry in _entries(value, field="usageLimits", known=known):
        name, match = _anchored_entry(entry, field=field)
        mode = entry.get("mode", USAGE_OBSERVE)
        if mode not in USAGE_MODES:
            raise InvalidSettings(f"{field}.mode: must be one of {', '.join(USAGE_MODES)}, got {mode!r}")
        grace = entry.get("gracePeriodSeconds", DEFAULT_USAGE_GRACE_S)
        if not isinstance(grace, int) or isinstance(grace, bool) or grace < 0:
            raise InvalidSettings(f"{field}.gracePeriodSeconds: must be a whole number of seconds >= 0, got {grace!r}")
        found.append(UsageLimit(name=name, match=match, mode=mode, grace_s=grace))
    return tuple(found)
_PROFILE_NAMES = ", ".join(schedulers.Name)


def _scheduler(value: object) -> schedulers.Scheduler:
    """`scheduler`: a profile name, or {profile, writers}; writers default to the scheduler's chart's."""
    if value is None:
        return schedulers.DEFAULT_SCHEDULER
    entry: Mapping[str, Any] = {"profile": value} if isinstance(value, str) else _mapping(value)
    if not entry:
        raise InvalidSettings(f"scheduler: must be a profile name ({_PROFILE_NAMES}) or a mapping with profile and writers, got {value!r}")
    _keys(entry, field="scheduler", known=("profile", "writers"))
    field = "scheduler" if isinstance(value, str) else "scheduler.profile"
    name = entry.get("profile")
    if name not in tuple(schedulers.Name):
        raise InvalidSettings(f"{field}: unknown scheduler profile {name!r}; known: {_PROFILE_NAMES}")
    profile = schedulers.PROFILES[schedulers.Name(name)]
    if entry.get("writers") is None:
        return schedulers.Scheduler(profile=profile, writers=profile.default_writers)
    if not profile.writer_annotations:
        raise InvalidSettings(f"scheduler.writers: the {profile.name} profile has no device annotations for anyone to write")
    writers: list[schedulers.ServiceAccount] = []
    for where, writer in _entries(
        entry["writers"], field="scheduler.writers", known=("namespace", "serviceAccount"), shape="{namespace: ..., serviceAccount: ...}"
    ):
        namespace, account = writer.get("namespace"), writer.get("serviceAccount")
        if not isinstance(namespace, str) or not schedulers.is_namespace_name(namespace):
            raise InvalidSettings(
                f"{where}.namespace: is required, the namespace of the service account (a namespace name), got {namespace!r}"
            )
        if not isinstance(account, str) or not schedulers.is_service_account_name(account):
            raise InvalidSettings(f"{where}.serviceAccount: is required, a service account name, got {account!r}")
        writers.append(schedulers.ServiceAccount(namespace=namespace, name=account))
    return schedulers.Scheduler(profile=profile, writers=tuple(dict.fromkeys(writers)))


def _legacy_allow(value: object) -> tuple[str, ...]:
    if not isinstance(value, Mapping):
        return ()
    found = value.get("allow")
    return tuple(hostpaths.resolve(p) for p in found) if isinstance(found, list) else ()


def _user_policies(extra: Iterable[policy.Policy]) -> tuple[policy.Policy, ...]:
    seen = {p.id for p in builtin.POLICIES}
    out = []
    for item in extra:
        if item.id in seen:
            raise InvalidSettings(f"policy {item.id}: the ID is already taken by another policy")
        seen.add(item.id)
        out.append(item)
    return tuple(out)


def from_mapping(data: Mapping[str, Any] | None, *, user_policies: Iterable[policy.Policy] = ()) -> Settings:
    """Settings from a loaded YAML document; raises InvalidSettings naming the first bad field.

    An empty document (None, as a YAML loader returns for an empty file) gives the defaults.
    `user_policies` (compiled CEL policies) join the built-ins: their IDs may then be named in
    `policies`, `namespaceOverrides` and `exceptions`.
    """
    extra = _user_policies(user_policies)
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise InvalidSettings(f"settings: must be a mapping, got {type(data).__name__}")
    for key in data:
        if key not in _KEYS:
            raise InvalidSettings(f"{key}: unknown key; known: {', '.join(_KEYS)}")
    defaults = {**_default_actions(), **{p.id: p.default_action for p in extra}}
    known = sorted(defaults)
    zone, allowance, zone_namespaces = _zone(data.get("trustZone"), data.get("hostPaths"))
    scheduler = _scheduler(data.get("scheduler"))
    if scheduler.profile.gpu_resources:
        zone = dataclasses.replace(zone, gpu_resources=(*zone.gpu_resources, *scheduler.profile.gpu_resources))
    loaded = Settings(
        actions=_policies(data.get("policies"), defaults=defaults),
        exempt_namespaces=_namespaces(data.get("exemptNamespaces")),
        default_shared_mode=_shared_mode(data.get("defaultSharedMode")),
        gpu_scheduler_name=_scheduler_name(data.get("gpuSchedulerName")),
        extender_scheduler_names=_extender_schedulers(data.get("extenderSchedulers")),
        keep_non_gpu_pods_off_gpu_nodes=_flag(
            data.get("keepNonGpuPodsOffGpuNodes"), field="keepNonGpuPodsOffGpuNodes"
        ),
        error_actions=_error_actions(data.get("errorActions")),
        visible_devices_neutral_value=_neutral_value(data.get("visibleDevicesNeutralValue")),
        user_policy_budget_s=_budget(data.get("userPolicyBudgetSeconds")),
        namespace_overrides=_override_list(data.get("namespaceOverrides"), known=known),
        exceptions=_exception_list(data.get("exceptions"), known=known),
        host_paths=_host_paths(data.get("hostPaths")),
        user_policies=extra,
        trust_zone=zone,
        zone_allowance=allowance,
        zone_namespaces=zone_namespaces,
        dra=_dra(data.get("dra")),
        usage_limits=_usage_limits(data.get("usageLimits")),
        scheduler=scheduler,
    )
    # The policies that assume this project's extender do not apply in front of another scheduler.
    return loaded.switched_off(scheduler.profile.skipped) if scheduler.profile.skipped else loaded


def _aware(moment: datetime.datetime) -> datetime.datetime:
    if moment.tzinfo is None:
        return moment.replace(tzinfo=datetime.timezone.utc)
    return moment.astimezone(datetime.timezone.utc)


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _labels(value: object) -> Mapping[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, Mapping) else {}


def _glob(name: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(name, pattern)
