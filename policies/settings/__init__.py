"""Engine settings: actions, namespace overrides, exceptions and the GPU parameters (no I/O).

`Settings()` is the built-in default. `from_mapping` parses the already-loaded YAML document
(loading files is the caller's job; this package does no I/O). This module joins the sections with
the built-in policies; each section is read in its own module, and none of them imports a policy:

- `shapes`: `InvalidSettings` and the readers of keys, lists, flags, names and times;
- `selection`: label selectors, namespace matches and anchoring to namespaces;
- `policyactions`: `policies`, `namespaceOverrides`, `exceptions`, `errorActions`;
- `trust`: `trustZone` and `hostPaths`; `claims`: `dra`; `usagelimits`: `usageLimits`;
  `budgets`: `gpuBudgets`;
- `scheduling`: `scheduler`, `gpuSchedulerName`, `extenderSchedulers`;
- `base`: the `Settings` the policies read (given the built-in policies, not importing them) and
  the scalar keys.

The schema, every key optional:

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
gpuBudgets:                        # GPU memory (and whole cards) each selected namespace may hold
  - name: team-a                   #   at once, charged in one unit (docs/concepts/budgets.md); the
    namespaces: [team-a]           #   first entry that matches decides, anchored as exceptions are;
    memory: 160Gi                  #   a quantity with a unit; a namespace no entry selects is
    cards: 4                       #   unlimited. cards (optional): whole cards at most
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
import types
from collections.abc import Iterable, Mapping
from typing import Any

from policies import builtin, model, policy
from policies.settings import base, budgets, claims, policyactions, scheduling, shapes, trust, usagelimits
from policies.settings.base import _ACTION_TABLES as _ACTION_TABLES

# The names callers use, from the section that owns each.
from policies.settings.base import DEFAULT_EXEMPT_NAMESPACES as DEFAULT_EXEMPT_NAMESPACES
from policies.settings.base import DEFAULT_USER_POLICY_BUDGET_S as DEFAULT_USER_POLICY_BUDGET_S
from policies.settings.base import MAX_USER_POLICY_BUDGET_S as MAX_USER_POLICY_BUDGET_S
from policies.settings.base import NEUTRAL_VISIBLE_DEVICES_CHOICES as NEUTRAL_VISIBLE_DEVICES_CHOICES
from policies.settings.base import expired_exceptions as expired_exceptions
from policies.settings.budgets import Budget as Budget
from policies.settings.budgets import budgets_of as budgets_of
from policies.settings.claims import DEFAULT_GPU_CLASSES as DEFAULT_GPU_CLASSES
from policies.settings.claims import ClaimGrant as ClaimGrant
from policies.settings.claims import DraSettings as DraSettings
from policies.settings.policyactions import NamespaceOverride as NamespaceOverride
from policies.settings.policyactions import PolicyException as PolicyException
from policies.settings.scheduling import DEFAULT_SCHEDULER as DEFAULT_SCHEDULER
from policies.settings.selection import NAMESPACE_NAME_LABEL as NAMESPACE_NAME_LABEL
from policies.settings.selection import LabelSelector as LabelSelector
from policies.settings.selection import NamespaceMatch as NamespaceMatch
from policies.settings.selection import Requirement as Requirement
from policies.settings.selection import label_selector as label_selector
from policies.settings.selection import labels_by_namespace as labels_by_namespace
from policies.settings.selection import labels_of_namespace as labels_of_namespace
from policies.settings.shapes import InvalidSettings as InvalidSettings
from policies.settings.trust import ZoneAllowance as ZoneAllowance
from policies.settings.usagelimits import DEFAULT_USAGE_GRACE_S as DEFAULT_USAGE_GRACE_S
from policies.settings.usagelimits import DEFAULT_USAGE_LIMIT as DEFAULT_USAGE_LIMIT
from policies.settings.usagelimits import USAGE_EVICT as USAGE_EVICT
from policies.settings.usagelimits import USAGE_MODES as USAGE_MODES
from policies.settings.usagelimits import USAGE_OBSERVE as USAGE_OBSERVE
from policies.settings.usagelimits import UsageLimit as UsageLimit
from policies.settings.usagelimits import usage_limits_of as usage_limits_of


def _default_actions() -> Mapping[str, model.Action]:
    return types.MappingProxyType({p.id: p.default_action for p in builtin.POLICIES})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings(base.Settings):
    """Everything the engine can be told; the defaults are the documented built-in behaviour.

    `base.Settings` with the built-in policies known (the one class callers make); the policies
    themselves read it as `base.Settings`.
    """

    builtin_policies: tuple[base.Known, ...] = dataclasses.field(default=builtin.POLICIES, repr=False)
    actions: Mapping[str, model.Action] = dataclasses.field(default_factory=_default_actions)
    # Validators from outside the built-ins (compiled CEL policies, see policies.cel), evaluated
    # after the built-in validators by every caller of the engine.
    user_policies: tuple[policy.Policy, ...] = ()


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
    "gpuBudgets",
    "scheduler",
)


def _user_policies(extra: Iterable[policy.Policy]) -> tuple[policy.Policy, ...]:
    seen = {p.id for p in builtin.POLICIES}
    out = []
    for item in extra:
        if item.id in seen:
            raise shapes.InvalidSettings(f"policy {item.id}: the ID is already taken by another policy")
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
        raise shapes.InvalidSettings(f"settings: must be a mapping, got {type(data).__name__}")
    for key in data:
        if key not in _KEYS:
            raise shapes.InvalidSettings(f"{key}: unknown key; known: {', '.join(_KEYS)}")
    defaults = {**_default_actions(), **{p.id: p.default_action for p in extra}}
    known = sorted(defaults)
    zone, allowance, zone_namespaces = trust.zone(data.get("trustZone"), data.get("hostPaths"))
    scheduler = scheduling.scheduler(data.get("scheduler"))
    if scheduler.profile.gpu_resources:
        zone = dataclasses.replace(zone, gpu_resources=(*zone.gpu_resources, *scheduler.profile.gpu_resources))
    loaded = Settings(
        actions=policyactions.policies(data.get("policies"), defaults=defaults),
        exempt_namespaces=base.namespaces(data.get("exemptNamespaces")),
        default_shared_mode=base.shared_mode(data.get("defaultSharedMode")),
        gpu_scheduler_name=scheduling.scheduler_name(data.get("gpuSchedulerName")),
        extender_scheduler_names=scheduling.extender_schedulers(data.get("extenderSchedulers")),
        keep_non_gpu_pods_off_gpu_nodes=shapes.flag(data.get("keepNonGpuPodsOffGpuNodes"), field="keepNonGpuPodsOffGpuNodes"),
        error_actions=policyactions.error_actions(data.get("errorActions")),
        visible_devices_neutral_value=base.neutral_value(data.get("visibleDevicesNeutralValue")),
        user_policy_budget_s=base.budget(data.get("userPolicyBudgetSeconds")),
        namespace_overrides=policyactions.override_list(data.get("namespaceOverrides"), known=known),
        exceptions=policyactions.exception_list(data.get("exceptions"), known=known),
        host_paths=trust.host_paths(data.get("hostPaths")),
        user_policies=extra,
        trust_zone=zone,
        zone_allowance=allowance,
        zone_namespaces=zone_namespaces,
        dra=claims.read(data.get("dra")),
        usage_limits=usagelimits.usage_limits(data.get("usageLimits")),
        gpu_budgets=budgets.budgets(data.get("gpuBudgets")),
        scheduler=scheduler,
    )
    # The policies that assume this project's extender do not apply in front of another scheduler.
    return loaded.switched_off(scheduler.profile.skipped) if scheduler.profile.skipped else loaded
