"""The policy engine: mutate, then validate the mutated object, and return one decision.

Public API (the webhook, the dry-run CLI and audit all call exactly this):

- `evaluate(request, *, settings) -> model.Decision`
- `POLICIES`: the registered policies in ID order, a tuple of objects with `id`, `kind`
  (`model.PolicyKind`), `summary` (the sentence denial messages start with) and `default_action`.

How a request is evaluated:

1. Short-circuits, each `allowed` with no patch and `exempt_reason` saying why: an exempt
   namespace; an object that is not a Pod, a supported workload or a kind some policy judges
   without a pod template (ConfigMap, Secret: GPU007); DELETE and CONNECT; a Pod UPDATE through
   a subresource other than `ephemeralcontainers` (status, binding, ...); a workload UPDATE whose
   pod template is unchanged (so a template that predates the webhook does not block scaling or
   relabelling; audit reports it).
   Only the policies whose `kinds` include the object's kind run (`policy.judges`): pod policies
   never see a ConfigMap, GPU007 never sees a Pod. A plain Pod UPDATE (no subresource) is judged
   only by the policies that declare `pod_updates` (GPU008, GPU010 and GPU013: the allocation and
   the device annotations, the budget gate); for every other policy the pod spec it judged at create is immutable,
   so a running pod's label or annotation edit is neither refused nor patched by them.
2. Mutators run in ID order on an in-memory copy, each on the previous one's output. A mutator
   acting `enforce` applies its additions; `warn` only warns with what it would add; `audit` only
   records it. Mutation runs on Pods (CREATE, and the `ephemeralcontainers` subresource, where only
   the new ephemeral containers are in scope) and on workload templates. For a workload,
   `Decision.patch` holds the template additions with paths into the workload
   (`/spec/template/spec/...`): it is what the workload's pods will get from the webhook, shown so
   the dry-run verdict matches reality. The webhook only registers Pods for mutation and so never
   sends it back for a workload.
   Each policy's action is `settings.action(id, namespace=..., namespace_labels=...)`: a namespace
   override, else the configured action, else the default (read from `settings.actions_in`, the
   same answers worked out once per namespace). A policy under an active exception for
   the object (`settings.exception`) is `Result.SKIP` with the message `exception <name>`.
3. Validators run on the mutated object: the built-ins, then `settings.user_policies` (compiled
   CEL policies, `policies.cel`), so every caller of `evaluate` gets the same user policies. A
   finding is a Violation carrying the policy's action; an uncertain finding (see
   policy.Finding) carries at most `warn`.
   Before a built-in runs, its pre-check (`relevant`, over `policies.applicability` facts read in
   one pass over the pod) may say it has nothing to find or add there; it is then recorded as the
   PASS running it would give. The facts are read again after a mutator's additions, unless
   those only touch `nodeSelector`, `affinity` or `schedulerName`. `evaluate(..., prechecks=False)`
   runs every policy; tests hold the two decisions equal.
4. `allowed` is False exactly when some violation acts `enforce`; `warnings` are the messages of
   `warn` violations and of `warn`-mode mutators; `patch` is empty when the request is denied.

A crashing policy is `Result.ERROR` with a violation `"<id>: policy error: <exception>"`, whose
action is the milder of the policy's own and `settings.error_action(kind)` (validate: enforce,
fail closed; mutate: warn, a broken mutator never blocks pods; its additions are dropped whole).
The engine never raises: anything unexpected outside the policies denies under the validate error
action, with the message `engine error: ...`.
"""

# CONTRACT (owned by the policies helper; keep these names and signatures):
#   evaluate(request: model.Request, *, settings: settings.Settings) -> model.Decision
#     - request.object may be a Pod or a workload (Deployment, StatefulSet, DaemonSet, ReplicaSet,
#       ReplicationController, Job, CronJob); for a workload the policies run on its pod template and
#       the patch paths point into the workload object.
#     - never raises: a crashing policy becomes Result.ERROR and a Violation with its action.
#     - Decision.patch applies cleanly with jsonpatch to request.object; a second evaluate on the
#       patched object returns an empty patch.

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping, Sequence
from typing import Any, cast

from policies import applicability, builtin, model, patching, podspec, policy
from policies import settings as settings_

POLICIES: tuple[policy.Policy, ...] = builtin.POLICIES
# Kinds without a pod template that some built-in judges (GPU007: ConfigMap, Secret).
_TEMPLATELESS_KINDS: frozenset[str] = frozenset(
    kind for item in POLICIES for kind in getattr(item, "kinds", ()) if kind not in podspec.SUPPORTED_KINDS
)

EPHEMERAL_SUBRESOURCE = podspec.EPHEMERAL_SUBRESOURCE


@dataclasses.dataclass(kw_only=True)
class _Outcome:
    """What evaluation accumulates, policy by policy (private and short-lived, hence mutable)."""

    results: dict[str, model.PolicyResult] = dataclasses.field(default_factory=dict)
    violations: list[model.Violation] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)
    notices: list[str] = dataclasses.field(default_factory=list)
    patch: list[patching.Operation] = dataclasses.field(default_factory=list)

    def violate(self, policy_id: str, action: model.Action, message: str) -> None:
        self.violations.append(model.Violation(policy=policy_id, action=action, message=message))
        if action is model.Action.WARN:
            self.warnings.append(message)

    def decision(self, *, ordered: Sequence[policy.Policy] = POLICIES) -> model.Decision:
        allowed = not any(v.action is model.Action.ENFORCE for v in self.violations)
        results = self.results
        if len(results) == len(ordered) and all(p.id in results for p in ordered):
            in_order = tuple(results[p.id] for p in ordered)  # the sort below, without the sort
        else:
            order = {p.id: i for i, p in enumerate(ordered)}
            in_order = tuple(sorted(results.values(), key=lambda r: order.get(r.policy, 0)))
        return model.Decision(
            allowed=allowed,
            results=in_order,
            violations=tuple(self.violations),
            warnings=tuple(self.warnings),
            notices=tuple(self.notices) if allowed else (),
            patch=tuple(self.patch) if allowed else (),
        )


def evaluate(request: model.Request, *, settings: settings_.Settings, prechecks: bool = True) -> model.Decision:
    """The decision for one request; never raises.

    ``prechecks=False`` runs every policy even where its pre-check (``relevant``, over the facts of
    ``policies.applicability``) says it has nothing to find: the same decision, slower; the tests
    hold the two equal.
    """
    try:
        return _evaluate(request, settings=settings, prechecks=prechecks)
    except Exception as exc:  # noqa: BLE001 - the engine's promise is to never raise
        action = settings.error_action(model.PolicyKind.VALIDATE)
        message = f"engine error: {type(exc).__name__}: {exc}"
        return model.Decision(
            allowed=action is not model.Action.ENFORCE,
            violations=(model.Violation(policy="engine", action=action, message=message),),
            warnings=(message,) if action is model.Action.WARN else (),
        )


def _namespace(request: model.Request) -> str:
    if request.namespace:
        return request.namespace
    metadata = podspec.mapping(podspec.mapping(request.object).get("metadata"))
    namespace = metadata.get("namespace")
    return namespace if isinstance(namespace, str) else ""


def _short_circuit(request: model.Request, *, settings: settings_.Settings) -> str:
    """Why the request is not evaluated, or "" when it is."""
    namespace = _namespace(request)
    if namespace in settings.exempt_namespaces:
        return f"namespace {namespace} is exempt"
    found = podspec.template(request.object)
    kind = podspec.mapping(request.object).get("kind")
    if found is None and kind not in _TEMPLATELESS_KINDS:
        return f"kind {kind!r} has no pod template"
    if request.operation not in ("CREATE", "UPDATE"):
        return f"operation {request.operation} is not evaluated"
    if found is None:  # a ConfigMap or Secret: every CREATE and UPDATE, no subresource
        return f"subresource {request.subresource} is not evaluated" if request.subresource else ""
    if request.operation == "UPDATE":
        if found.is_pod and request.subresource not in ("", EPHEMERAL_SUBRESOURCE):
            return f"subresource {request.subresource} is not evaluated"
        if not found.is_pod:
            old = podspec.template(request.old_object)
            if old is not None and (old.spec, old.annotations) == (found.spec, found.annotations):
                return "the pod template is unchanged"
    elif request.subresource:
        return f"subresource {request.subresource} is not evaluated"
    return ""


def _context(
    request: model.Request,
    *,
    settings: settings_.Settings,
    working: Mapping[str, Any],
    ephemeral_only: bool,
) -> policy.Context:
    found = podspec.template(working)
    if found is None:
        kind = working.get("kind")
        if kind not in _TEMPLATELESS_KINDS:  # mutators only add below the template: it cannot vanish
            raise RuntimeError("the pod template vanished during mutation")
        # No pod in it: an empty template carrying the object's metadata, and no containers.
        metadata = podspec.mapping(working.get("metadata"))
        empty = podspec.Template(kind=str(kind), spec_path="", spec={}, metadata_path="/metadata", metadata=metadata)
        return policy.Context(request=request, settings=settings, template=empty, containers=(), whole_pod=True, object=working)
    if ephemeral_only:
        containers = tuple(podspec.new_ephemeral_containers(working, old_object=request.old_object))
    else:
        containers = tuple(podspec.iter_containers(found.spec, spec_path=found.spec_path))
    return policy.Context(
        request=request,
        settings=settings,
        template=found,
        containers=containers,
        whole_pod=not ephemeral_only,
        object=working,
    )


# Pod spec fields the mutators add to that no template, container or pre-check fact is read from.
_SCHEDULING_FIELDS: frozenset[str] = frozenset({"nodeSelector", "affinity", "schedulerName"})


def _scheduling_only(operations: Sequence[patching.Operation], context: policy.Context) -> bool:
    """Whether `operations`, applied in place to the context's object, left the context as it was.

    `patching.apply` adds in place: an `add` at or below `<spec>/nodeSelector`, `<spec>/affinity` or
    `<spec>/schedulerName` changes that key of the spec mapping the context already holds, and
    nothing `_context` or `applicability.of` builds (the template's paths and metadata, the
    containers and their paths, the facts) is read from those keys; policies read the keys
    themselves through `context.template.spec`, which is the same mapping.
    """
    spec_path = context.template.spec_path
    if not context.template.is_pod and not spec_path:
        return False
    prefix = spec_path + "/"
    for operation in operations:
        path = operation.get("path")
        if not isinstance(path, str) or not path.startswith(prefix):
            return False
        if path[len(prefix) :].split("/", 1)[0] not in _SCHEDULING_FIELDS:
            return False
    return True


def _message(item: policy.Policy, detail: str) -> str:
    return f"{item.id}: {item.summary}: {detail}"


def _error(
    outcome: _Outcome, item: policy.Policy, *, action: model.Action, settings: settings_.base.Settings, exc: Exception
) -> None:
    message = f"{item.id}: policy error: {type(exc).__name__}: {exc}"
    outcome.results[item.id] = model.PolicyResult(policy=item.id, result=model.Result.ERROR, message=message)
    outcome.violate(item.id, model.milder(action, settings.error_action(item.kind)), message)


def _report(outcome: _Outcome, item: policy.Policy, action: model.Action, findings: list[policy.Finding]) -> None:
    if not findings:
        passed = _PASSED.get(item.id)
        outcome.results[item.id] = passed if passed is not None else model.PolicyResult(policy=item.id, result=model.Result.PASS)
        return
    for finding in findings:
        effective = action if finding.certain else model.milder(action, model.Action.WARN)
        outcome.violate(item.id, effective, _message(item, finding.detail))
    certain = any(f.certain for f in findings)
    outcome.results[item.id] = model.PolicyResult(
        policy=item.id,
        result=model.Result.FAIL if certain else model.Result.WARN,
        message="; ".join(f.detail for f in findings),
    )


def _mutate(
    outcome: _Outcome,
    item: policy.Mutator,
    *,
    action: model.Action,
    context: policy.Context,
    working: dict[str, Any],
) -> None:
    try:
        mutation = item.mutate(context)
        if action is model.Action.ENFORCE and mutation.operations:
            # All or nothing (patching.apply undoes a partial application), so a mutator whose
            # operations do not fit is dropped whole instead of leaving half its additions behind.
            patching.apply(working, mutation.operations)
    except Exception as exc:  # noqa: BLE001 - a crashing policy is an ERROR result, not a crash
        _error(outcome, item, action=action, settings=context.settings, exc=exc)
        return
    _report(outcome, item, action, list(mutation.problems))
    if not mutation.operations:
        return
    described = "; ".join(mutation.changes)
    if action is model.Action.ENFORCE:
        outcome.patch.extend(mutation.operations)
        outcome.notices.extend(_message(item, notice) for notice in mutation.notices)
        message = described
    else:
        message = f"would have {described}" if described else "would have changed the pod"
        if action is model.Action.WARN:
            outcome.warnings.append(_message(item, message))
    previous = outcome.results[item.id]
    outcome.results[item.id] = model.PolicyResult(
        policy=previous.policy, result=previous.result, message="; ".join(m for m in (previous.message, message) if m)
    )


_Plan = tuple[tuple[policy.Policy, ...], tuple[tuple[policy.Policy, bool], ...]]


def _plan(policies: Sequence[policy.Policy], kind: object, *, pod_update: bool) -> _Plan:
    """The policies that judge `kind` in registry order, and the order they run in (mutators
    first, each flagged as one)."""
    registered = tuple(p for p in policies if policy.judges(p, kind) and (not pod_update or policy.judges_pod_updates(p)))
    mutators = tuple((p, True) for p in registered if isinstance(p, policy.Mutator))
    return registered, mutators + tuple((p, False) for p in registered if not isinstance(p, policy.Mutator))


# The built-ins' plans for every kind some built-in judges, worked out once: `_evaluate` would
# otherwise filter and split the registry (ABC isinstance checks) on every request.
_PLANS: Mapping[tuple[str, bool], _Plan] = types.MappingProxyType(
    {
        (kind, pod_update): _plan(POLICIES, kind, pod_update=pod_update)
        for kind in podspec.SUPPORTED_KINDS | _TEMPLATELESS_KINDS
        for pod_update in (False, True)
    }
)
# A policy that passes says nothing else: one shared (frozen) result per built-in.
_PASSED: Mapping[str, model.PolicyResult] = types.MappingProxyType(
    {p.id: model.PolicyResult(policy=p.id, result=model.Result.PASS) for p in POLICIES}
)


def _evaluate(request: model.Request, *, settings: settings_.Settings, prechecks: bool = True) -> model.Decision:
    reason = _short_circuit(request, settings=settings)
    if reason:
        return model.Decision(allowed=True, exempt_reason=reason)
    ephemeral_only = request.subresource == EPHEMERAL_SUBRESOURCE
    # Copy on write: the policies read `working`, and only a mutator that runs writes to it, so the
    # deep copy is made just before the first one runs. With every mutator off (audit judges objects
    # as stored) the validators read the request's object itself and nothing is copied.
    working: Mapping[str, Any] = request.object
    thawed: dict[str, Any] | None = None
    outcome = _Outcome()
    kind = working.get("kind")
    pod_update = request.operation == "UPDATE" and kind == "Pod" and not request.subresource
    user_policies = settings.user_policies
    planned = None if user_policies or not isinstance(kind, str) else _PLANS.get((kind, pod_update))
    registered, steps = planned or _plan((*POLICIES, *user_policies), kind, pod_update=pod_update)
    namespace = _namespace(request)
    namespace_labels = request.namespace_labels
    actions = settings.actions_in(namespace, namespace_labels)  # worked out once per namespace and settings
    user_ids = {p.id for p in user_policies}
    exceptions = bool(settings.exceptions)
    results = outcome.results
    budget_started: float | None = None
    # The context (template, containers with their paths) only changes when a mutator's additions
    # land in `working`, which is exactly when the patch grows; rebuilt then, not per policy, and
    # only for a policy that runs: one that is off or under an exception never needs it. The
    # pre-checks' facts (policies.applicability) follow the context.
    context: policy.Context | None = None
    facts: applicability.Facts | None = None
    context_at = -1
    for item, mutator in steps:
        item_id = item.id
        action = actions.get(item_id)
        if action is None:
            action = settings.action(item_id, namespace=namespace, namespace_labels=namespace_labels)
        if action is model.Action.OFF:
            results[item_id] = model.PolicyResult(policy=item_id, result=model.Result.SKIP, message="off")
            continue
        if exceptions:
            exception = settings.exception(
                item_id, namespace=namespace, namespace_labels=namespace_labels, obj=request.object, now=request.now
            )
            if exception is not None:
                results[item_id] = model.PolicyResult(
                    policy=item_id, result=model.Result.SKIP, message=f"exception {exception.name}"
                )
                continue
        if thawed is None and mutator:
            working = thawed = patching.thaw(request.object)
            context = None
        if context is None or (context_at != len(outcome.patch) and not _scheduling_only(outcome.patch[context_at:], context)):
            context = _context(request, settings=settings, working=working, ephemeral_only=ephemeral_only)
            facts = None
        context_at = len(outcome.patch)
        try:
            enabled = item.enabled(context)
        except Exception as exc:  # noqa: BLE001 - see _mutate
            _error(outcome, item, action=action, settings=settings, exc=exc)
            continue
        if not enabled:
            results[item_id] = model.PolicyResult(policy=item_id, result=model.Result.SKIP, message="not configured")
            continue
        relevant = getattr(item, "relevant", None) if prechecks else None
        if relevant is not None:
            # Nothing here for the policy to find or add: the PASS that running it would give.
            if facts is None:
                facts = applicability.of(context)
            try:
                needed = relevant(context, facts)
            except Exception as exc:  # noqa: BLE001 - see _mutate
                _error(outcome, item, action=action, settings=settings, exc=exc)
                continue
            if not needed:
                _report(outcome, item, action, [])
                continue
        if mutator:
            assert thawed is not None  # copied above, before this mutator's context was built
            _mutate(outcome, cast(policy.Mutator, item), action=action, context=context, working=thawed)
        elif isinstance(item, policy.Validator):
            if item.id in user_ids and request.clock is not None:
                # CEL cannot be interrupted mid-expression; what can be bounded is how long the
                # user policies of one request run together: past the budget the rest are errors.
                elapsed = request.clock()
                budget_started = elapsed if budget_started is None else budget_started
                if elapsed - budget_started > settings.user_policy_budget_s:
                    spent = TimeoutError(
                        f"the {settings.user_policy_budget_s:g} s budget for user policies was spent before it ran"
                    )
                    _error(outcome, item, action=action, settings=settings, exc=spent)
                    continue
            try:
                findings = list(item.validate(context))
            except Exception as exc:  # noqa: BLE001 - see _mutate
                _error(outcome, item, action=action, settings=settings, exc=exc)
                continue
            _report(outcome, item, action, findings)
    return outcome.decision(ordered=registered)
