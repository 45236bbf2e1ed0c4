"""The settings the policies read, as one frozen object that knows no policy by module.

`Settings` joins the sections (`policyactions`, `trust`, `claims`, `usagelimits`, `budgets`, `scheduling`) and
answers what the policies ask of them: a policy's action in a namespace, the exception that exempts
an object, the trust zone's allowance. It is given the built-in policies (`builtin_policies`) rather
than importing them, so the policies can read it without an import circle. The scalar keys
(`exemptNamespaces`, `defaultSharedMode`, `visibleDevicesNeutralValue`, `userPolicyBudgetSeconds`)
are read here too.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, Self

from policies import gpu, hostpaths, model, schedulers, trustzone
from policies.settings import budgets, claims, policyactions, scheduling, selection, shapes, trust, usagelimits

DEFAULT_EXEMPT_NAMESPACES: frozenset[str] = frozenset({"kube-system", "kube-node-lease", "gpu-admission"})
# NVIDIA_VISIBLE_DEVICES values that expose no device node: `void` (and empty) behave like runc,
# `none` mounts the driver but no card. Anything else could name cards, so it cannot be configured.
NEUTRAL_VISIBLE_DEVICES_CHOICES: tuple[str, ...] = ("void", "none", "")
# Well under the webhook's timeoutSeconds (5 in deploy/), so a request still gets an answer in time.
DEFAULT_USER_POLICY_BUDGET_S = 1.0
MAX_USER_POLICY_BUDGET_S = 30.0


# How many per-namespace action tables one Settings keeps (`Settings.actions_in`).
_ACTION_TABLES = 1024


class Known(Protocol):
    """What the settings know of a policy: a built-in or a user policy, read by ID, kind and defaults."""

    @property
    def id(self) -> str: ...

    @property
    def kind(self) -> model.PolicyKind: ...

    @property
    def default_action(self) -> model.Action: ...

    @property
    def stored_objects(self) -> bool: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything the engine can be told, for the policies `builtin_policies` and `user_policies`.

    The policies read their settings as this class and know no other. The built-in policies are
    given to it, not imported: `policies.settings.Settings`, the one callers make, names them as the
    default of `builtin_policies` and of `actions`; here both are empty.
    """

    # The built-in policies these settings are for (what `action` falls back to, what
    # `for_stored_objects` and `without_mutators` switch off); not shown in the repr.
    builtin_policies: tuple[Known, ...] = dataclasses.field(default=(), repr=False)
    actions: Mapping[str, model.Action] = dataclasses.field(default_factory=dict)
    exempt_namespaces: frozenset[str] = DEFAULT_EXEMPT_NAMESPACES
    default_shared_mode: gpu.Mode = gpu.Mode.CGPU
    gpu_scheduler_name: str = ""
    # The schedulers that call the scheduler extender (GPU008); see `extender_schedulers`.
    extender_scheduler_names: tuple[str, ...] = (scheduling.DEFAULT_SCHEDULER,)
    keep_non_gpu_pods_off_gpu_nodes: bool = False
    error_actions: Mapping[model.PolicyKind, model.Action] = dataclasses.field(
        default_factory=policyactions.default_error_actions
    )
    visible_devices_neutral_value: str = gpu.VISIBLE_DEVICES_VOID
    user_policy_budget_s: float = DEFAULT_USER_POLICY_BUDGET_S
    namespace_overrides: tuple[policyactions.NamespaceOverride, ...] = ()
    exceptions: tuple[policyactions.PolicyException, ...] = ()
    # The trust zone (`trustZone`): which pods can reach a GPU node, and what they may have there.
    trust_zone: trustzone.TrustZone = trustzone.DEFAULT_ZONE
    zone_allowance: trustzone.Allowance = trustzone.DEFAULT_ALLOWANCE
    zone_namespaces: tuple[trust.ZoneAllowance, ...] = ()
    # Validators from outside the built-ins (compiled CEL policies, see policies.cel), evaluated
    # after the built-in validators by every caller of the engine.
    user_policies: tuple[Known, ...] = ()
    # GPU003's protected roots and allowed host paths (`hostPaths`).
    host_paths: hostpaths.HostPathRules = hostpaths.DEFAULT_RULES
    dra: claims.DraSettings = claims.DraSettings()
    # What the labeler does about pods above their GPU memory request (`usageLimits`).
    usage_limits: tuple[usagelimits.UsageLimit, ...] = ()

    def usage_limit(self, namespace: str, namespace_labels: Mapping[str, str] | None = None) -> usagelimits.UsageLimit:
        """The first `usageLimits` entry that matches the namespace, else observe (DEFAULT_USAGE_LIMIT)."""
        labels = selection.labels_of_namespace(namespace, namespace_labels)
        for entry in self.usage_limits:
            if entry.match.matches(namespace, labels):
                return entry
        return usagelimits.DEFAULT_USAGE_LIMIT

    # What each namespace may hold of GPU memory and whole cards (`gpuBudgets`; the extender keeps them).
    gpu_budgets: tuple[budgets.Budget, ...] = ()

    def gpu_budget(self, namespace: str, namespace_labels: Mapping[str, str] | None = None) -> budgets.Budget | None:
        """The first `gpuBudgets` entry that selects the namespace; None where none does (unlimited)."""
        return budgets.budget_for(self.gpu_budgets, namespace, namespace_labels)

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
            labels = selection.labels_of_namespace(namespace, namespace_labels)
            for override in self.namespace_overrides:
                if policy_id in override.actions and override.match.matches(namespace, labels):
                    return override.actions[policy_id]
        found = self.actions.get(policy_id)
        if found is not None:
            return found
        for item in (*self.builtin_policies, *self.user_policies):
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
        ids = dict.fromkeys([*(p.id for p in self.builtin_policies), *(p.id for p in self.user_policies), *self.actions])
        return {policy_id: self.action(policy_id, namespace=namespace, namespace_labels=namespace_labels) for policy_id in ids}

    @functools.cached_property
    def _action_tables(self) -> dict[object, Mapping[str, model.Action]]:
        return {}

    def switched_off(self, policy_ids: Iterable[str]) -> Self:
        """These settings with the named policies off everywhere: no namespace override turns them back on."""
        off = frozenset(policy_ids)
        actions = {**self.actions, **{policy_id: model.Action.OFF for policy_id in off}}
        overrides = tuple(
            dataclasses.replace(o, actions={k: v for k, v in o.actions.items() if k not in off}) for o in self.namespace_overrides
        )
        return dataclasses.replace(self, actions=actions, namespace_overrides=overrides)

    def for_stored_objects(self) -> Self:
        """Settings to judge an object as stored (audit, explain): the validators that judge what a
        request writes rather than the object (GPU008: a bound pod carries nodeName and the
        extender's allocation by design) are off."""
        off = self.switched_off(p.id for p in self.builtin_policies if not p.stored_objects)
        return dataclasses.replace(off, stored_objects=True)

    @functools.cached_property
    def without_mutators(self) -> Self:
        """These settings with every built-in mutator off: a pod judged as stored (the validating
        webhook), where what the mutators would add must already be there."""
        return self.switched_off(p.id for p in self.builtin_policies if p.kind is model.PolicyKind.MUTATE)

    def exception(
        self,
        policy_id: str,
        *,
        namespace: str,
        namespace_labels: Mapping[str, str] | None = None,
        obj: Mapping[str, Any],
        now: datetime.datetime | None,
    ) -> policyactions.PolicyException | None:
        """The first active exception that exempts `obj` from the policy, or None."""
        labels = selection.labels_of_namespace(namespace, namespace_labels)
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
            labels = selection.labels_of_namespace(namespace, namespace_labels)
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


def expired_exceptions(settings: Settings, *, now: datetime.datetime) -> list[policyactions.PolicyException]:
    """The exceptions whose `expires` has passed at `now` (audit reports them as findings)."""
    return [e for e in settings.exceptions if e.expired(now)]


def namespaces(value: object) -> frozenset[str]:
    if value is None:
        return DEFAULT_EXEMPT_NAMESPACES
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise shapes.InvalidSettings(f"exemptNamespaces: must be a list of namespace names, got {value!r}")
    return frozenset(value)


def shared_mode(value: object) -> gpu.Mode:
    if value is None:
        return gpu.Mode.CGPU
    choices = ", ".join(gpu.DEFAULT_SHARED_MODE_CHOICES)
    if isinstance(value, str) and value in gpu.DEFAULT_SHARED_MODE_CHOICES:
        return gpu.Mode(value)
    raise shapes.InvalidSettings(f"defaultSharedMode: must be one of {choices}, got {value!r}")


def neutral_value(value: object) -> str:
    if value is None:
        return gpu.VISIBLE_DEVICES_VOID
    if isinstance(value, str) and value.strip().lower() in NEUTRAL_VISIBLE_DEVICES_CHOICES:
        return value.strip().lower()
    choices = ", ".join(repr(c) for c in NEUTRAL_VISIBLE_DEVICES_CHOICES)
    raise shapes.InvalidSettings(
        f"visibleDevicesNeutralValue: must be one of {choices} (values that expose no GPU), got {value!r}"
    )


def budget(value: object) -> float:
    if value is None:
        return DEFAULT_USER_POLICY_BUDGET_S
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_USER_POLICY_BUDGET_S:
        raise shapes.InvalidSettings(
            f"userPolicyBudgetSeconds: must be a number of seconds above 0 and at most {MAX_USER_POLICY_BUDGET_S:g}, "
            f"got {value!r}"
        )
    return float(value)
