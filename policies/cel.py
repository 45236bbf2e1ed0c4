"""User policies in CEL: ValidatingAdmissionPolicy-shaped documents compiled once, evaluated bounded.

A user policy is a document (loaded from YAML by the caller; this package does no I/O)::

    apiVersion: gpu-admission.io/v1alpha1
    kind: GpuAdmissionPolicy
    metadata:
      name: max-gpus-per-pod                  # the exported ValidatingAdmissionPolicy's name part
    spec:
      id: TEAM001                             # stable ID: settings, reports and messages use it
      summary: pods ask for at most a few GPUs   # optional; messages start "<id>: <summary>: "
      action: enforce                         # default action; settings can override it
      matchConstraints:
        resourceRules:                        # as in ValidatingAdmissionPolicy
          - apiGroups: [""]
            apiVersions: ["v1"]
            operations: ["CREATE"]
            resources: ["pods"]
        namespaceSelector: {matchLabels: {gpu-limited: "true"}}   # optional
        objectSelector: {matchLabels: {team: a}}                   # optional
      params: {maxGpus: 2}                    # any YAML; the expressions see it as `params`
      matchConditions:                        # all must be true, else the policy passes
        - name: has-gpu-limits
          expression: "object.spec.containers.exists(c, has(c.resources.limits))"
      validations:                            # each false one is a finding
        - expression: "..."
          message: "..."                      # or messageExpression (a string expression)

The expressions see `object` (after the built-in mutators, as the apiserver's validating stage
does), `oldObject` (null on CREATE), `request` (kind, resource, subResource, name, namespace,
operation, userInfo, dryRun), `params` and `namespaceObject` (metadata.name and labels). The
language is cel-go's as Kubernetes runs it: the standard library with type checking, the
`strings`, `optional` and `math` extensions, and `sum()` on lists from Kubernetes' list library.
Kubernetes-only libraries (quantity, url, ip, cidr, semver, authorizer) and `cel.bind` (which
kube-apiserver 1.34 refuses in ValidatingAdmissionPolicy) are not available, so a policy that uses
them is refused at load.

Bounds (the guarantees, see `MAX_EXPRESSION_CHARS`, `MAX_INPUT_NODES`, `MAX_INPUT_CHARS`):

- compile once, at load: a syntax error, an unknown variable or function, or a validation that
  cannot be a bool is refused with the field and the line/column of the error;
- an expression is at most 5,000 characters; an object (plus oldObject) handed to CEL at most
  200,000 values and 2,000,000 characters of strings, else the policy is an `error` result;
- one evaluation runs at most 10,000 comprehension iterations in total (the CEL runtime's
  iteration budget: all/exists/map/filter over all nesting levels together); past it the
  evaluation stops with an error, which is an `error` result;
- regular expressions are RE2 (linear time), and CEL has no loops or recursion besides the
  comprehensions, so one evaluation is bounded by the budget times the work of one iteration on
  a bounded input;
- time: the runtime holds the GIL and cannot be interrupted, so no thread or signal can stop one
  expression. The engine bounds the user policies of one request together instead: once
  `userPolicyBudgetSeconds` (default 1 s, measured with the caller's clock, `Request.clock`) is
  spent, the user policies not yet run are `error` results. The worst case is therefore the budget
  plus one expression, and one ordinary expression takes microseconds (see bench/README.md); an
  expression scanning megabyte strings in every one of 10,000 iterations can take seconds, in
  which case kube-apiserver's webhook timeout (5 s) answers first, failing closed.
- not bounded: memory for a deliberately hostile expression (string concatenation inside a
  comprehension). Policy files are trusted like the webhook's settings.

An `error` result acts as the milder of the policy's action and `errorActions.validate` (by
default: enforce, so a policy that cannot be evaluated fails closed).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

from policies import model, podspec, policy
from policies import settings as settings_

API_VERSION = "gpu-admission.io/v1alpha1"
KIND = "GpuAdmissionPolicy"
MAX_EXPRESSION_CHARS = 5_000
MAX_INPUT_NODES = 200_000
MAX_INPUT_CHARS = 2_000_000
ITERATION_BUDGET = 10_000  # cel-cpp's default RuntimeOptions.comprehension_max_iterations (fixed there)
VARIABLES = ("object", "oldObject", "request", "params", "namespaceObject")

_ID = re.compile(r"^[A-Z][A-Z0-9_-]{1,31}$")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_POSITION = re.compile(r"<input>:(\d+):(\d+): (.*)")

# The kinds the engine evaluates, as resourceRules name them: resource -> (group, kind).
RESOURCES: Mapping[str, tuple[str, str]] = types.MappingProxyType(
    {
        "pods": ("", "Pod"),
        "replicationcontrollers": ("", "ReplicationController"),
        "deployments": ("apps", "Deployment"),
        "statefulsets": ("apps", "StatefulSet"),
        "daemonsets": ("apps", "DaemonSet"),
        "replicasets": ("apps", "ReplicaSet"),
        "jobs": ("batch", "Job"),
        "cronjobs": ("batch", "CronJob"),
    }
)
_RESOURCE_OF_KIND = {kind: resource for resource, (_, kind) in RESOURCES.items()}
_OPERATIONS = ("CREATE", "UPDATE", "*")
_SPEC_KEYS = ("id", "summary", "action", "matchConstraints", "params", "matchConditions", "validations")


class InvalidPolicy(ValueError):
    """A user policy that cannot be loaded; one line naming the source, the policy and the field."""


class EvaluationError(RuntimeError):
    """A CEL expression that failed at evaluation (missing field, budget exceeded, wrong type...)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResourceRule:
    """One `matchConstraints.resourceRules` entry."""

    api_groups: tuple[str, ...]
    api_versions: tuple[str, ...]
    operations: tuple[str, ...]
    resources: tuple[str, ...]

    def matches(self, *, group: str, version: str, resource: str, operation: str) -> bool:
        """Whether a request for `resource` (maybe `pods/ephemeralcontainers`) is covered."""
        return (
            ("*" in self.api_groups or group in self.api_groups)
            and ("*" in self.api_versions or version in self.api_versions)
            and ("*" in self.operations or operation in self.operations)
            and ("*" in self.resources or resource in self.resources)
        )

    def as_mapping(self) -> dict[str, Any]:
        """The rule as the ValidatingAdmissionPolicy API writes it."""
        return {
            "apiGroups": list(self.api_groups),
            "apiVersions": list(self.api_versions),
            "operations": list(self.operations),
            "resources": list(self.resources),
        }


@dataclasses.dataclass(frozen=True)
class Expression:
    """One compiled CEL expression and where it came from."""

    field: str  # e.g. spec.validations[0].expression
    source: str
    program: Any = dataclasses.field(compare=False, repr=False)  # cel_expr_python Expression


@dataclasses.dataclass(frozen=True, kw_only=True)
class Validation:
    """A validation: the expression that must be true and what to say when it is not."""

    expression: Expression
    message: str = ""
    message_expression: Expression | None = None
    reason: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Spec:
    """A user policy, validated and compiled; everything the engine and the exporter need."""

    id: str
    name: str
    source: str  # file#document, for messages
    summary: str
    action: model.Action
    rules: tuple[ResourceRule, ...]
    namespace_selector: settings_.LabelSelector | None
    namespace_selector_document: Mapping[str, Any] | None  # as written, for export
    object_selector: settings_.LabelSelector | None
    object_selector_document: Mapping[str, Any] | None
    params: Any
    match_conditions: tuple[tuple[str, Expression], ...]
    validations: tuple[Validation, ...]


class CelPolicy(policy.Validator):
    """A validator whose checks are CEL expressions; one subclass per loaded policy (see `compile_policy`)."""

    spec: ClassVar[Spec]

    def validate(self, context: policy.Context) -> Iterable[policy.Finding]:
        """A finding for every false validation; none where the policy does not match the request."""
        if not self._matches(context):
            return ()
        activation = _activation(self.spec, context)
        for name, condition in self.spec.match_conditions:
            matched = evaluate(condition, activation)
            if not isinstance(matched, bool):
                raise EvaluationError(f"matchCondition {name!r} returned {type(matched).__name__}, not a bool")
            if not matched:
                return ()
        findings = []
        for validation in self.spec.validations:
            passed = evaluate(validation.expression, activation)
            if not isinstance(passed, bool):
                raise EvaluationError(f"{validation.expression.field} returned {type(passed).__name__}, not a bool")
            if not passed:
                findings.append(policy.Finding(detail=_message(validation, activation)))
        return findings

    def _matches(self, context: policy.Context) -> bool:
        obj = context.object or context.request.object
        kind = str(obj.get("kind", ""))
        resource = _RESOURCE_OF_KIND.get(kind)
        if resource is None:
            return False
        group, _, version = str(obj.get("apiVersion", "")).rpartition("/")
        if context.request.subresource:
            resource = f"{resource}/{context.request.subresource}"
        if not any(
            rule.matches(group=group, version=version, resource=resource, operation=context.request.operation)
            for rule in self.spec.rules
        ):
            return False
        if self.spec.namespace_selector is not None:
            labels = settings_.labels_of_namespace(context.namespace, context.request.namespace_labels)
            if not self.spec.namespace_selector.matches(labels):
                return False
        if self.spec.object_selector is not None:
            labels = podspec.mapping(podspec.mapping(obj.get("metadata")).get("labels"))
            if not self.spec.object_selector.matches({str(k): str(v) for k, v in labels.items()}):
                return False
        return True


@functools.cache
def _runtime() -> Any:
    """cel-expr-python, imported on the first compile: it costs about 14 MiB resident, which a
    webhook, dry-run or audit with no user policy never needs to pay."""
    # cel-expr-python ships .pyi stubs without a py.typed marker, so mypy will not read them; the
    # runtime objects are handled as Any here and checked by the unit tests.
    from cel_expr_python import cel  # type: ignore[import-untyped]  # noqa: PLC0415

    return cel


def environment(*, extra: Sequence[str] = ()) -> Any:
    """A CEL environment with the variables and libraries user policies may use (and `extra` names,
    such as `variables` for tests that evaluate exported policies' variables)."""
    from cel_expr_python.ext import (  # type: ignore[import-untyped]  # noqa: PLC0415
        ext_math,
        ext_optional,
        ext_strings,
    )

    cel_runtime = _runtime()
    # Kubernetes' list library: `sum()` of a list of numbers. One dyn overload: the runtime erases
    # list element types, so int and double overloads would collide.
    sum_decl = cel_runtime.FunctionDecl(
        "sum",
        [
            cel_runtime.Overload(
                "list_sum",
                return_type=cel_runtime.Type.DYN,
                parameters=[cel_runtime.Type.List(cel_runtime.Type.DYN)],
                is_member=True,
                impl=_sum,
            )
        ],
    )
    return cel_runtime.NewEnv(
        variables={name: cel_runtime.Type.DYN for name in (*VARIABLES, *extra)},
        extensions=[
            ext_strings.ExtStrings(),
            ext_optional.ExtOptional(),
            ext_math.ExtMath(),
        ],
        functions=[sum_decl],
    )


def _sum(values: Sequence[Any]) -> Any:
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise TypeError("sum() needs a list of numbers")
    if all(isinstance(v, int) for v in values) and not -(2**63) <= sum(values) < 2**63:
        raise OverflowError("sum() overflows int64")
    return sum(values)


def compile_expression(env: Any, text: object, *, field: str, want: str = "bool") -> Expression:
    """Compile one expression; raises InvalidPolicy with the field and the line/column of the error.

    `want` is the result type the checker must allow: "bool" (validations, matchConditions),
    "string" (messageExpression).
    """
    if not isinstance(text, str) or not text.strip():
        raise InvalidPolicy(f"{field}: must be a non-empty CEL expression, got {text!r}")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise InvalidPolicy(f"{field}: {len(text)} characters, more than the limit of {MAX_EXPRESSION_CHARS}")
    try:
        program = env.compile(text)
    except RuntimeError as error:
        raise InvalidPolicy(f"{field}: {_compile_error(str(error))}") from None
    returned = program.return_type()
    types_ = _runtime().Type
    allowed = (types_.DYN, types_.BOOL if want == "bool" else types_.STRING)
    if not any(returned == t for t in allowed):
        raise InvalidPolicy(f"{field}: must evaluate to a {want}, but its type is {returned.name().lower()}")
    return Expression(field=field, source=text, program=program)


def _compile_error(text: str) -> str:
    for line in text.splitlines():
        found = _POSITION.search(line)
        if found:
            return f"line {found.group(1)}, column {found.group(2)}: {found.group(3).strip()}"
    return " ".join(text.split())


def evaluate(expression: Expression, activation: Mapping[str, Any]) -> Any:
    """The expression's plain Python value; raises EvaluationError on a CEL error (budget included)."""
    try:
        value = expression.program.eval(data=activation)
    except RuntimeError as error:
        raise EvaluationError(f"{expression.field}: {_runtime_error(str(error))}") from None
    if value.type() == _runtime().Type.ERROR:
        raise EvaluationError(f"{expression.field}: {_runtime_error(str(value.value()))}")
    return value.plain_value()


def _runtime_error(text: str) -> str:
    text = " ".join(text.split())
    text = re.sub(r"^[A-Z_]+: ", "", text)
    return re.sub(r" \[[A-Z_]+\]$", "", text)


def _message(validation: Validation, activation: Mapping[str, Any]) -> str:
    if validation.message_expression is not None:
        try:
            text = evaluate(validation.message_expression, activation)
        except EvaluationError:
            text = None
        if isinstance(text, str) and text.strip():
            return " ".join(text.split())
    if validation.message:
        return validation.message
    return f"failed expression: {validation.expression.source}"


def _activation(spec: Spec, context: policy.Context) -> dict[str, Any]:
    request = context.request
    obj = _plain_input(context.object or request.object, field="object")
    old = None if request.old_object is None else _plain_input(request.old_object, field="oldObject")
    kind = str(obj.get("kind", ""))
    group, _, version = str(obj.get("apiVersion", "")).rpartition("/")
    metadata = podspec.mapping(obj.get("metadata"))
    labels = settings_.labels_of_namespace(context.namespace, request.namespace_labels)
    return {
        "object": obj,
        "oldObject": old,
        "request": {
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": _RESOURCE_OF_KIND.get(kind, "")},
            "subResource": request.subresource,
            "name": str(metadata.get("name") or ""),
            "namespace": context.namespace,
            "operation": request.operation,
            "userInfo": {"username": request.user, "groups": list(request.groups)},
            "dryRun": request.dry_run,
        },
        "params": spec.params,
        "namespaceObject": {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": context.namespace, "labels": dict(labels)},
        },
    }


def _plain_input(value: Any, *, field: str) -> Any:
    """`value` as the plain dicts/lists/scalars CEL takes, refusing inputs past the size limits."""
    budget = [MAX_INPUT_NODES, MAX_INPUT_CHARS]

    def walk(item: Any) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise EvaluationError(f"{field} has more than {MAX_INPUT_NODES} values, past the CEL input limit")
        if isinstance(item, Mapping):
            # A null field is an absent one, as in the apiserver's objects (a manifest's bare `env:`).
            return {str(k): walk(v) for k, v in item.items() if v is not None}
        if isinstance(item, (list, tuple)):
            return [walk(v) for v in item]
        if isinstance(item, str):
            budget[1] -= len(item)
            if budget[1] < 0:
                raise EvaluationError(f"{field} holds more than {MAX_INPUT_CHARS} characters, past the CEL input limit")
            return item
        if isinstance(item, bool) or item is None or isinstance(item, float):
            return item
        if isinstance(item, int):
            if not -(2**63) <= item < 2**63:
                raise EvaluationError(f"{field} holds the integer {item}, outside int64")
            return item
        return str(item)  # nothing else comes out of JSON or YAML manifests; be lenient, not fatal

    return walk(value)


# --- loading ---------------------------------------------------------------------------------------


def compile_policy(document: object, *, source: str, env: Any | None = None) -> policy.Validator:
    """The engine policy for one user-policy document; raises InvalidPolicy naming source and field."""
    spec = parse_spec(document, source=source, env=env)
    # The policy shape keeps id, summary and default action on the class (policy.Policy), so each
    # user policy gets a class of its own.
    attributes = {"id": spec.id, "summary": spec.summary, "default_action": spec.action, "spec": spec}
    made: type[CelPolicy] = type(f"CelPolicy_{spec.id}", (CelPolicy,), attributes)
    return made()


def spec_of(item: policy.Policy) -> Spec | None:
    """The spec behind a user policy, or None for a built-in."""
    return item.spec if isinstance(item, CelPolicy) else None


def parse_spec(document: object, *, source: str, env: Any | None = None) -> Spec:
    """Validate and compile one user-policy document (see the module docstring for the shape)."""
    env = environment() if env is None else env
    if not isinstance(document, Mapping):
        raise InvalidPolicy(f"{source}: a policy must be a mapping, got {type(document).__name__}")
    if document.get("apiVersion") != API_VERSION or document.get("kind") != KIND:
        raise InvalidPolicy(
            f"{source}: apiVersion/kind must be {API_VERSION}/{KIND}, got {document.get('apiVersion')!r}/{document.get('kind')!r}"
        )
    metadata = podspec.mapping(document.get("metadata"))
    spec = document.get("spec")
    if not isinstance(spec, Mapping):
        raise InvalidPolicy(f"{source}: spec: is required (a mapping)")
    policy_id = spec.get("id")
    if not isinstance(policy_id, str) or not _ID.match(policy_id):
        raise InvalidPolicy(
            f"{source}: spec.id: must be 2-32 upper-case letters, digits, '-' or '_' starting with a letter, got {policy_id!r}"
        )
    where = f"{source}: policy {policy_id}"
    _known_keys(spec, field="spec", known=_SPEC_KEYS, where=where)
    name = metadata.get("name", policy_id.lower())
    if not isinstance(name, str) or not _NAME.match(name) or len(name) > 200:
        raise InvalidPolicy(f"{where}: metadata.name: must be a lower-case DNS name, got {name!r}")
    summary = spec.get("summary", name)
    if not isinstance(summary, str) or not summary.strip():
        raise InvalidPolicy(f"{where}: spec.summary: must be a non-empty string, got {summary!r}")
    try:
        action = _action(spec.get("action", "enforce"))
    except ValueError:
        raise InvalidPolicy(
            f"{where}: spec.action: must be one of {', '.join(model.Action)}, got {spec.get('action')!r}"
        ) from None
    constraints = spec.get("matchConstraints")
    if not isinstance(constraints, Mapping):
        raise InvalidPolicy(f"{where}: spec.matchConstraints: is required (a mapping with resourceRules)")
    rules = _rules(constraints.get("resourceRules"), where=where)
    known_constraints = ("resourceRules", "namespaceSelector", "objectSelector")
    _known_keys(constraints, field="spec.matchConstraints", known=known_constraints, where=where)
    selectors: dict[str, tuple[settings_.LabelSelector | None, Mapping[str, Any] | None]] = {}
    for key in ("namespaceSelector", "objectSelector"):
        raw = constraints.get(key)
        try:
            parsed = None if raw is None else settings_.label_selector(raw, field=f"spec.matchConstraints.{key}")
        except settings_.InvalidSettings as error:
            raise InvalidPolicy(f"{where}: {error}") from None
        selectors[key] = (parsed, raw)
    conditions: list[tuple[str, Expression]] = []
    raw_conditions = spec.get("matchConditions") or []
    if not isinstance(raw_conditions, list):
        raise InvalidPolicy(f"{where}: spec.matchConditions: must be a list, got {raw_conditions!r}")
    for index, entry in enumerate(raw_conditions):
        field = f"spec.matchConditions[{index}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise InvalidPolicy(f"{where}: {field}: must be a mapping with name and expression, got {entry!r}")
        if any(entry["name"] == existing for existing, _ in conditions):
            raise InvalidPolicy(f"{where}: {field}.name: {entry['name']!r} is used twice")
        try:
            compiled = compile_expression(env, entry.get("expression"), field=f"{field}.expression")
        except InvalidPolicy as error:
            raise InvalidPolicy(f"{where}: {error}") from None
        conditions.append((entry["name"], compiled))
    validations = _validations(env, spec.get("validations"), where=where)
    params = spec.get("params")
    try:
        params = _plain_input(params, field="spec.params")
    except EvaluationError as error:
        raise InvalidPolicy(f"{where}: {error}") from None
    return Spec(
        id=policy_id,
        name=name,
        source=source,
        summary=" ".join(summary.split()),
        action=action,
        rules=rules,
        namespace_selector=selectors["namespaceSelector"][0],
        namespace_selector_document=selectors["namespaceSelector"][1],
        object_selector=selectors["objectSelector"][0],
        object_selector_document=selectors["objectSelector"][1],
        params=params,
        match_conditions=tuple(conditions),
        validations=validations,
    )


def _action(value: object) -> model.Action:
    if value is False:  # YAML 1.1: a bare `off`
        return model.Action.OFF
    if isinstance(value, str):
        return model.Action(value.strip().lower())
    raise ValueError(value)


def _strings(value: object, *, field: str, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise InvalidPolicy(f"{where}: {field}: must be a non-empty list of strings, got {value!r}")
    return tuple(value)


def _known_keys(value: Mapping[str, Any], *, field: str, known: Sequence[str], where: str) -> None:
    for key in value:
        if key not in known:
            raise InvalidPolicy(f"{where}: {field}.{key}: unknown key; known: {', '.join(known)}")


def _entries(
    value: object, *, field: str, known: Sequence[str], where: str, shape: str = "a mapping"
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each entry of a non-empty list of mappings with only `known` keys, and the field that names it."""
    if not isinstance(value, list) or not value:
        raise InvalidPolicy(f"{where}: {field}: must be a non-empty list, got {value!r}")
    for index, entry in enumerate(value):
        here = f"{field}[{index}]"
        if not isinstance(entry, Mapping):
            raise InvalidPolicy(f"{where}: {here}: must be {shape}, got {entry!r}")
        _known_keys(entry, field=here, known=known, where=where)
        yield here, entry


def _rules(value: object, *, where: str) -> tuple[ResourceRule, ...]:
    rules = []
    for here, entry in _entries(
        value,
        field="spec.matchConstraints.resourceRules",
        known=("apiGroups", "apiVersions", "operations", "resources", "scope"),
        where=where,
    ):
        rule = ResourceRule(
            api_groups=_strings(entry.get("apiGroups"), field=f"{here}.apiGroups", where=where),
            api_versions=_strings(entry.get("apiVersions"), field=f"{here}.apiVersions", where=where),
            operations=_strings(entry.get("operations"), field=f"{here}.operations", where=where),
            resources=_strings(entry.get("resources"), field=f"{here}.resources", where=where),
        )
        for position, operation in enumerate(rule.operations):
            if operation not in _OPERATIONS:
                raise InvalidPolicy(
                    f"{where}: {here}.operations[{position}]: must be CREATE, UPDATE or * "
                    f"(only those reach the policies), got {operation!r}"
                )
        known = (*RESOURCES, "pods/ephemeralcontainers", "*")
        for position, resource in enumerate(rule.resources):
            if resource not in known:
                raise InvalidPolicy(
                    f"{where}: {here}.resources[{position}]: {resource!r} is not evaluated here; known: {', '.join(known)}"
                )
        rules.append(rule)
    return tuple(rules)


def _validations(env: Any, value: object, *, where: str) -> tuple[Validation, ...]:
    out = []
    for field, entry in _entries(
        value,
        field="spec.validations",
        known=("expression", "message", "messageExpression", "reason"),
        where=where,
        shape="a mapping with expression and message",
    ):
        message = entry.get("message", "")
        if not isinstance(message, str) or "\n" in message.strip():
            raise InvalidPolicy(f"{where}: {field}.message: must be a one-line string, got {message!r}")
        reason = entry.get("reason", "")
        if not isinstance(reason, str):
            raise InvalidPolicy(f"{where}: {field}.reason: must be a string, got {reason!r}")
        try:
            expression = compile_expression(env, entry.get("expression"), field=f"{field}.expression")
            message_expression = (
                None
                if entry.get("messageExpression") is None
                else compile_expression(env, entry["messageExpression"], field=f"{field}.messageExpression", want="string")
            )
        except InvalidPolicy as error:
            raise InvalidPolicy(f"{where}: {error}") from None
        out.append(
            Validation(expression=expression, message=message.strip(), message_expression=message_expression, reason=reason)
        )
    return tuple(out)
