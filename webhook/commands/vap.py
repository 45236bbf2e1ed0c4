"""ValidatingAdmissionPolicy export: the rules CEL can express, run inside kube-apiserver under the webhook.

``export(settings, now=...)`` returns ValidatingAdmissionPolicy + ValidatingAdmissionPolicyBinding
manifests (``admissionregistration.k8s.io/v1``), one pair per policy, named
``gpu-admission-<id>``. They are a fail-closed second layer: the apiserver evaluates them itself, so
they still refuse the bypasses when the webhook is down, misconfigured or deleted. They never
refuse what the webhook would admit, only (where CEL cannot see as much) admit some of what it
would refuse:

- GPU001 by value: ``NVIDIA_VISIBLE_DEVICES`` in ``env`` must be void/none (or the configured
  neutral value), and ``valueFrom`` for it is refused; the isolation variables
  (``gpu.ISOLATION_ENV``) are refused in ``env`` however set; an ``envFrom`` prefix that begins a
  guarded name the container's ``env`` does not set is refused. What ``envFrom`` without a prefix
  delivers is not judged here (GPU007 guards the sources; the webhook looks them up); neither is
  GPU007 exported: it needs the keys of ConfigMaps and Secrets, which the webhook entry's match
  condition already selects in the apiserver;
- GPU002: no privileged container (``privileged: true``, or SYS_ADMIN/ALL added) in a pod that
  requests a GPU resource or targets GPU nodes;
- GPU003 on the path as written, with the settings' extra roots and allowed paths: the same rule
  as the webhook's for any path the apiserver accepts (it refuses ``..``; repeated and trailing
  slashes, ``.`` and the ``/var/run`` and ``/var/lock`` spellings are allowed for);
- GPU004: positive integers (digits as the apiserver writes quantities; ``1k`` is not read),
  in limits, requests equal to limits, ``gpu-core.percentage`` at most 100 and beside ``gpu-mem``,
  one resource family per pod;
- every user policy (``--policies-dir``) as written, with its ``params`` written into the
  expressions as a literal: the apiserver declares ``params`` only for a ``paramKind``, refuses
  ``cel.bind``, and gives match conditions no ``variables``; so the identifier ``params`` (outside
  string literals and field names) becomes the literal, its map values and list items ``dyn()``
  as the type checker wants for mixed types.

GPU005 and the mutators are not exported. The settings shape the export: a policy that is not
``enforce`` anywhere is left out (bindings use ``validationActions: [Deny]``); namespace overrides
become a match condition on the namespace; exceptions that have not expired at export time become
match conditions that leave their objects out (CEL has no clock, so an exception with an expiry
keeps applying in the apiserver until the manifests are exported again; the webhook stops
applying it on time). Bindings leave out the exempt namespaces by ``kubernetes.io/metadata.name``,
as ``deploy/webhook-configurations.yaml`` does, and a kubelet's mirror pods, as its match condition does
(a mirror annotation written by anyone else is judged).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml

from policies import builtin, cel, gpu, hostpaths, model, nodeaffinity, podspec, trustzone
from policies import settings as settings_

API_VERSION = "admissionregistration.k8s.io/v1"
PREFIX = "gpu-admission-"
EXPORTED_BUILTINS = ("GPU001", "GPU002", "GPU003", "GPU004")
MIRROR_POD = (
    "request.resource.resource != 'pods' || !has(object.metadata.annotations) || "
    "!('kubernetes.io/config.mirror' in object.metadata.annotations) || "
    "!request.userInfo.username.startsWith('system:node:')"
)
_POSITIVE_OPERATORS = ("In", "Exists", "Gt", "Lt")
# The variable GPU002's and GPU003's validations read: whether the pod can reach a GPU node.
REACH = "reachesGpuNodes"
STAYS_OFF = "staysOffGpuNodes"  # GPU103's affinity in every required term (its own variable: length)
_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rule:
    """One exported policy before it becomes manifests."""

    id: str
    name: str  # the VAP name, gpu-admission-<...>
    resource_rules: tuple[Mapping[str, Any], ...]
    validations: tuple[Mapping[str, Any], ...]
    # Named expressions the validations read as `variables.<name>` (VAP spec.variables).
    variables: tuple[Mapping[str, str], ...] = ()
    match_conditions: tuple[Mapping[str, str], ...] = ()
    namespace_selector: Mapping[str, Any] | None = None
    object_selector: Mapping[str, Any] | None = None
    source: str = "built-in"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Export:
    """The manifests, and notes for the person exporting (left-out policies, expiry caveats)."""

    manifests: tuple[dict[str, Any], ...]
    notes: tuple[str, ...]


def export(settings: settings_.Settings, *, now: datetime.datetime) -> Export:
    """The VAP and binding manifests for `settings` (built-ins and `settings.user_policies`)."""
    notes: list[str] = []
    manifests: list[dict[str, Any]] = []
    summaries = {p.id: p.summary for p in builtin.POLICIES}
    rules = [_builtin(policy_id, summary=summaries[policy_id], settings=settings) for policy_id in EXPORTED_BUILTINS]
    for item in settings.user_policies:
        spec = cel.spec_of(item)
        if spec is not None:
            rules.append(_user(spec))
    for rule in rules:
        enforced = _enforced_here(rule.id, settings)
        if enforced is None:
            notes.append(f"{rule.id}: left out: its action is not enforce in any namespace")
            continue
        conditions = [{"name": "not-a-mirror-pod", "expression": MIRROR_POD}, *rule.match_conditions]
        if enforced != "true":
            conditions.append({"name": "enforced-in-this-namespace", "expression": enforced})
        for index, exception in enumerate(settings.exceptions):
            if rule.id not in exception.policies or exception.expired(now):
                continue
            conditions.append(
                {
                    "name": f"exception-{index}-{_dns(exception.name)}"[:63].rstrip("-"),
                    "expression": f"!({_exception_matches(exception)})",
                }
            )
            if exception.expires is not None:
                notes.append(
                    f"{rule.id}: exception {exception.name} expires {exception.expires.isoformat()}; "
                    "export again after that, the apiserver cannot tell"
                )
        manifests.extend(_manifests(rule, conditions=conditions, exempt=settings.exempt_namespaces))
    return Export(manifests=tuple(manifests), notes=tuple(notes))


def render(manifests: Iterable[Mapping[str, Any]]) -> str:
    """The manifests as one multi-document YAML stream, ready for ``kubectl apply -f``."""
    header = "# Generated by `gpu-admission policies export-vap`; edit the policies and export again.\n"
    return header + yaml.safe_dump_all(
        [json.loads(json.dumps(m)) for m in manifests], sort_keys=False, explicit_start=True, width=1000
    )


# --- manifests -------------------------------------------------------------------------------------


def _manifests(rule: Rule, *, conditions: Sequence[Mapping[str, str]], exempt: frozenset[str]) -> list[dict[str, Any]]:
    labels = {"app.kubernetes.io/name": "gpu-admission", "app.kubernetes.io/component": "validating-admission-policy"}
    constraints: dict[str, Any] = {"resourceRules": [dict(r) for r in rule.resource_rules]}
    if rule.namespace_selector is not None:
        constraints["namespaceSelector"] = rule.namespace_selector
    if rule.object_selector is not None:
        constraints["objectSelector"] = rule.object_selector
    policy = {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {
            "name": rule.name,
            "labels": labels,
            "annotations": {"gpu-admission.io/policy-id": rule.id, "gpu-admission.io/source": rule.source},
        },
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": constraints,
            "matchConditions": [dict(c) for c in conditions],
            **({"variables": [dict(v) for v in rule.variables]} if rule.variables else {}),
            "validations": [dict(v) for v in rule.validations],
        },
    }
    binding_spec: dict[str, Any] = {"policyName": rule.name, "validationActions": ["Deny"]}
    if exempt:
        binding_spec["matchResources"] = {
            "namespaceSelector": {
                "matchExpressions": [{"key": settings_.NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": sorted(exempt)}]
            }
        }
    binding = {
        "apiVersion": API_VERSION,
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": rule.name, "labels": labels},
        "spec": binding_spec,
    }
    return [policy, binding]


_POD_RULES: tuple[Mapping[str, Any], ...] = (
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"},
    {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["UPDATE"],
        "resources": ["pods/ephemeralcontainers"],
        "scope": "Namespaced",
    },
)


def _builtin(policy_id: str, *, summary: str, settings: settings_.Settings) -> Rule:
    def validation(expression: str, detail: str) -> dict[str, str]:
        return {"expression": expression, "message": f"{policy_id}: {summary}: {detail}", "reason": "Forbidden"}

    if policy_id == "GPU001":
        safe = sorted({*gpu.VISIBLE_DEVICES_SAFE_VALUES, settings.visible_devices_neutral_value})
        env = gpu.VISIBLE_DEVICES_ENV
        check = (
            f"!has(c.env) || c.env.all(e, e.name != {_lit(env)} || "
            f"((has(e.value) || !has(e.valueFrom)) && e.?value.orValue('').trim().lowerAscii() in {_lit(safe)}))"
        )
        isolation = f"!has(c.env) || c.env.all(e, !(e.name in {_lit(sorted(gpu.ISOLATION_ENV))}))"
        # A prefix that begins a guarded name the container's env does not set itself (env beats
        # envFrom); a prefix-less envFrom is GPU007's to guard, as in the webhook.
        prefixes = (
            "!has(c.envFrom) || c.envFrom.all(s, !has(s.prefix) || s.prefix == '' || "
            f"!{_lit(sorted(gpu.GUARDED_ENV))}.exists(g, g.startsWith(s.prefix) && g.size() > s.prefix.size() && "
            "!(has(c.env) && c.env.exists(e, e.name == g))))"
        )
        validations = [
            validation(
                _every_container(check),
                f"a container sets {env} to a value other than {' or '.join(repr(s) for s in safe)}, or through "
                "valueFrom; request GPUs as resources",
            ),
            validation(
                _every_container(isolation),
                "a container sets a GPU-sharing isolation variable (CGPU_DISABLE, ALIYUN_COM_GPU_MEM_*, ...); "
                "remove it and request aliyun.com/gpu-mem instead",
            ),
            validation(
                _every_container(prefixes),
                "a container takes envFrom with a prefix that composes a GPU variable; use a prefix that begins "
                "no GPU variable (e.g. APP_)",
            ),
        ]
    elif policy_id == "GPU002":
        allowance = settings.widest_allowance
        capability = "x.trim().upperAscii()"
        named = f"({capability}.startsWith('CAP_') ? {capability}.substring(4) : {capability})"
        container = (
            "!(has(c.securityContext) && has(c.securityContext.privileged) && c.securityContext.privileged) && "
            f"dyn(c).?securityContext.?capabilities.?add.orValue([]).all(x, {named} in {_lit(sorted(allowance.capabilities))}"
            + ") && dyn(c).?securityContext.?procMount.orValue('Default') == 'Default' && "
            "!dyn(c).?securityContext.?windowsOptions.?hostProcess.orValue(false) && "
            f"{_selinux_ok('dyn(c).?securityContext.?seLinuxOptions')}"
        )
        # Where an allowance lets a host namespace in, the capabilities that need the pod's own are refused beside it.
        for namespace in sorted(set(trustzone.NEEDS_OWN_NAMESPACE.values()) & allowance.host_namespaces):
            needing = sorted(c for c, n in trustzone.NEEDS_OWN_NAMESPACE.items() if n == namespace)
            container += (
                f" && (!object.spec.?{namespace}.orValue(false) || "
                f"!dyn(c).?securityContext.?capabilities.?add.orValue([]).exists(x, {named} in {_lit(needing)}))"
            )
        pod = " && ".join(
            [
                f"!object.spec.?{field}.orValue(false)"
                for field in trustzone.HOST_NAMESPACES
                if field not in allowance.host_namespaces
            ]
            + [
                "!object.spec.?securityContext.?windowsOptions.?hostProcess.orValue(false)",
                _selinux_ok("object.spec.?securityContext.?seLinuxOptions"),
            ]
        )
        validations = [
            validation(
                f"!variables.{REACH} || ({pod} && {_every_container(container)})",
                "a pod that can reach a GPU node has a privilege GPU nodes do not allow (privileged, a capability "
                "outside the allowlist, a host namespace, procMount, SELinux options or a Windows host process)",
            ),
            validation(
                f"!variables.{REACH} || {_every_container(_host_ports_ok(allowance))}",
                "a pod that can reach a GPU node asks for a host port outside the allowed ones (the kubelet's, "
                "a node daemon's or one of ours among them)",
            ),
        ]
    elif policy_id == "GPU003":
        allowance = settings.widest_allowance
        kinds = " || ".join(f"has(v.{kind})" for kind in sorted(allowance.volume_types))
        # A read-only entry allows what lies under it, a writable one only itself (trustzone.Allowance.host_path).
        allowed = (
            _LEAD
            + "(?:"
            + "|".join(
                f"(?:{a}){_UNDER if entry.read_only else _END + '$'}"
                for entry in allowance.host_paths
                for a in _spellings(entry.path)
            )
            + ")"
        )
        validations = [
            validation(
                f"!variables.{REACH} || !has(object.spec.volumes) || object.spec.volumes.all(v, {kinds} || "
                f"(has(v.hostPath) && v.hostPath.path.matches({_lit(allowed)})))",
                "a pod that can reach a GPU node mounts a host path or a volume type GPU nodes do not allow; use an "
                "emptyDir, a PersistentVolumeClaim or a ConfigMap, or ask an admin to allow the path (trustZone)",
            )
        ]
    else:  # GPU004
        limits, requests = "dyn(c).?resources.?limits.orValue({})", "dyn(c).?resources.?requests.orValue({})"
        core, mem, count = _lit(gpu.Resource.GPU_CORE_PERCENTAGE), _lit(gpu.Resource.GPU_MEM), _lit(gpu.Resource.GPU_COUNT)
        families = (
            f"[{_any_container(_names_any(sorted({gpu.Resource.NVIDIA_GPU, *gpu.NVIDIA_GPU_RESOURCES}), prefix=gpu.NVIDIA_MIG_PREFIX))}, "
            f"{_any_container(_names_any([gpu.Resource.GPU_MEM, gpu.Resource.GPU_CORE_PERCENTAGE]))}, "
            f"{_any_container(_names_any([gpu.Resource.ALIYUN_GPU]))}].filter(x, x).size() <= 1"
        )
        validations = [
            validation(
                _every_container(
                    f"{limits}.all(k, !{_is_gpu_resource('k')} || "
                    f"(string({limits}[k]).matches('^[0-9]+$') && int(string({limits}[k])) > 0))"
                ),
                "a GPU resource limit is not a positive integer",
            ),
            validation(
                _every_container(
                    f"{requests}.all(k, !{_is_gpu_resource('k')} || "
                    f"(k in {limits} && string({requests}[k]) == string({limits}[k])))"
                ),
                "a GPU resource is requested without an equal limit",
            ),
            validation(
                _every_container(
                    f"!({core} in {limits}) || !string({limits}[{core}]).matches('^[0-9]+$') || "
                    f"int(string({limits}[{core}])) <= {gpu.MAX_CORE_PERCENTAGE}"
                ),
                f"{gpu.Resource.GPU_CORE_PERCENTAGE} is above {gpu.MAX_CORE_PERCENTAGE}",
            ),
            validation(
                _every_container(f"!({core} in {limits} || {count} in {limits}) || {mem} in {limits}"),
                f"{gpu.Resource.GPU_CORE_PERCENTAGE} and {gpu.Resource.GPU_COUNT} come only beside {gpu.Resource.GPU_MEM}",
            ),
            validation(
                families, "the pod mixes GPU resource families (one of nvidia.com/gpu, aliyun.com/gpu-mem, aliyun.com/gpu)"
            ),
        ]
    variables = (
        ({"name": STAYS_OFF, "expression": _stays_off(settings)}, {"name": REACH, "expression": _reach(settings)})
        if policy_id in ("GPU002", "GPU003")
        else ()
    )
    return Rule(
        id=policy_id,
        name=PREFIX + policy_id.lower(),
        resource_rules=_POD_RULES,
        validations=tuple(validations),
        variables=variables,
    )


def _user(spec: cel.Spec) -> Rule:
    literal = _dyn_lit(spec.params)

    def bound(expression: str) -> str:
        return expression if spec.params is None else rewrite_params(expression, literal=literal)

    prefix = f"{spec.id}: {spec.summary}: "
    validations = []
    for item in spec.validations:
        out: dict[str, str] = {"expression": bound(item.expression.source)}
        out["message"] = prefix + (item.message or f"failed expression: {' '.join(item.expression.source.split())}")
        if item.message_expression is not None:
            out["messageExpression"] = f"{_lit(prefix)} + ({bound(item.message_expression.source)})"
        out["reason"] = (
            item.reason if item.reason in ("Unauthorized", "Forbidden", "Invalid", "RequestEntityTooLarge") else "Forbidden"
        )
        validations.append(out)
    return Rule(
        id=spec.id,
        name=PREFIX + spec.name,
        resource_rules=tuple({**r.as_mapping(), "scope": "Namespaced"} for r in spec.rules),
        validations=tuple(validations),
        match_conditions=tuple(
            {"name": name, "expression": bound(expression.source)} for name, expression in spec.match_conditions
        ),
        namespace_selector=spec.namespace_selector_document,
        object_selector=spec.object_selector_document,
        source=spec.source,
    )


# A CEL token: a string literal (quotes, triple quotes, r/b prefixes), an identifier, or anything else.
_TOKEN = re.compile(
    r"""(?P<string>[rRbB]{0,2}(?:'\'\'[\s\S]*?'\'\'|\"\"\"[\s\S]*?\"\"\"|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"))"""
    r"|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)|(?P<other>\s+|.)",
    re.DOTALL,
)


def rewrite_params(expression: str, *, literal: str) -> str:
    """`expression` with the variable `params` replaced by `(literal)` (strings and fields untouched)."""
    out: list[str] = []
    previous = ""
    for token in _TOKEN.finditer(expression):
        text = token.group(0)
        if token.lastgroup == "ident" and text == "params" and previous != ".":
            text = f"({literal})"
        out.append(text)
        if not text.isspace():
            previous = text[-1]
    return "".join(out)


# --- CEL generation --------------------------------------------------------------------------------


# Paths as written: `/`, `./` and repeated slashes between components are allowed for; `..` never
# reaches a policy (the apiserver refuses it in hostPath.path), so it needs no reading here.
_LEAD = r"^(?:\.?/)*"
_SEP = r"/(?:\.?/)*"
_UNDER = r"(?:/.*)?$"
_END = r"(?:/\.?)*"


def _spellings(path: str) -> list[str]:
    """Regex alternatives for a resolved path as a pod may write it, the /var/run and /var/lock links included."""
    parts = [p for p in path.split("/") if p]
    spelled = [parts]
    for link, target in hostpaths.HOST_LINKS.items():
        if tuple(parts[: len(target)]) == target:  # in the link's target: /run/x is also /var/run/x
            spelled.append([*link, *parts[len(target) :]])
        elif tuple(target[: len(parts)]) == tuple(parts):  # above it: all of /var/lock lies in /run
            spelled.append(list(link))
    return [_SEP.join(re.escape(p) for p in parts) for parts in spelled]


def _lit(value: Any) -> str:
    """A CEL literal for a JSON-like value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_lit(str(k))}: {_lit(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_lit(v) for v in value) + "]"
    return _lit(str(value))


def _dyn_lit(value: Any) -> str:
    """A CEL literal whose map values and list items are `dyn(...)`, so mixed types type-check."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_lit(str(k))}: dyn({_dyn_lit(v)})" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(f"dyn({_dyn_lit(v)})" for v in value) + "]"
    return _lit(value)


def _every_container(predicate: str) -> str:
    """`predicate` (over `c`) holds for every container, init and ephemeral container."""
    return " && ".join(f"object.spec.?{name}.orValue([]).all(c, {predicate})" for name in _CONTAINER_LISTS)


def _any_container(predicate: str) -> str:
    return "(" + " || ".join(f"object.spec.?{name}.orValue([]).exists(c, {predicate})" for name in _CONTAINER_LISTS) + ")"


def _names_any(resources: Sequence[str], *, prefix: str = "") -> str:
    wanted = _lit(list(resources))
    test = f"k in {wanted}" + (f" || k.startsWith({_lit(prefix)})" if prefix else "")
    return (
        f"dyn(c).?resources.?limits.orValue({{}}).exists(k, {test}) || "
        f"dyn(c).?resources.?requests.orValue({{}}).exists(k, {test})"
    )


def _is_gpu_resource(key: str, zone: trustzone.TrustZone = trustzone.DEFAULT_ZONE) -> str:
    """CEL for `gpu.is_gpu_resource` (with `zone`'s extra names): the explicit list and the MIG prefix."""
    names, prefixes = _gpu_names(zone)
    return "(" + " || ".join([f"{key} in {_lit(names)}", *(f"{key}.startsWith({_lit(p)})" for p in prefixes)]) + ")"


def _gpu_names(zone: trustzone.TrustZone) -> tuple[list[str], list[str]]:
    """The GPU resource names and name prefixes, built-in and `zone`'s."""
    names = sorted({*gpu.GPU_RESOURCES, *gpu.NVIDIA_GPU_RESOURCES, *(n for n in zone.gpu_resources if not n.endswith("*"))})
    prefixes = sorted({gpu.NVIDIA_MIG_PREFIX, *(n[:-1] for n in zone.gpu_resources if n.endswith("*"))})
    return names, prefixes


def _requests_gpu(zone: trustzone.TrustZone = trustzone.DEFAULT_ZONE) -> str:
    names, prefixes = _gpu_names(zone)
    test = " || ".join([f"k in {_lit(names)}", *(f"k.startsWith({_lit(p)})" for p in prefixes)])
    return _any_container(
        f"dyn(c).?resources.?limits.orValue({{}}).exists(k, {test}) || "
        f"dyn(c).?resources.?requests.orValue({{}}).exists(k, {test})"
    )


def _reach(settings: settings_.Settings) -> str:
    """CEL for `trustzone.reach` as far as the object shows it: true where the pod can reach a GPU node.

    The webhook also knows a bound pod's node on the ephemeralcontainers subresource; here, on that
    subresource, only a pod that asks for GPUs or GPU nodes counts, so the export never refuses
    what the webhook admits.
    """
    if settings.trust_zone.strict:
        return "true"
    asked = (
        f"({_requests_gpu(settings.trust_zone)} || object.spec.?resourceClaims.orValue([]).size() > 0 || {_targets_gpu_nodes()})"
    )
    return f"({asked} || (!variables.{STAYS_OFF} && request.?subResource.orValue('') != {_lit(podspec.EPHEMERAL_SUBRESOURCE)}))"


def _stays_off(settings: settings_.Settings) -> str:
    """CEL for `trustzone.stays_off_gpu_nodes`: every required term fails every GPU node label."""
    terms = "object.spec.?affinity.?nodeAffinity.?requiredDuringSchedulingIgnoredDuringExecution.?nodeSelectorTerms.orValue([])"
    return f"({terms}.size() > 0 && {terms}.all(t, {_fails_labels(settings.trust_zone.node_labels)}))"


def _fails_labels(labels: Sequence[trustzone.NodeLabel]) -> str:
    """CEL over a nodeSelectorTerm `t`: it holds every label's keep-off requirement
    (trustzone.stays_off_gpu_nodes), the labels grouped by their values to keep the expression short."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for label in labels:
        groups.setdefault(label.values, []).append(label.key)
    parts = []
    for values, keys in groups.items():
        test = "e.operator == 'DoesNotExist'"
        if values:
            test += f" || (e.operator == 'NotIn' && {_lit(list(values))}.all(v, v in e.?values.orValue([])))"
        parts.append(f"{_lit(keys)}.all(k, t.?matchExpressions.orValue([]).exists(e, e.key == k && ({test})))")
    return " && ".join(parts)


def _host_ports_ok(allowance: trustzone.Allowance) -> str:
    """CEL over a container `c`: every hostPort it asks for is in the allowance (trustzone.Allowance.host_port)."""
    ranges = " || ".join(f"(h >= {r.low} && h <= {r.high})" for r in allowance.host_ports) or "false"
    return f"dyn(c).?ports.orValue([]).all(p, dyn(p).?hostPort.orValue(0) == 0 || [dyn(p).hostPort].all(h, {ranges}))"


def _selinux_ok(options: str) -> str:
    """CEL: the SELinux options at `options` (an optional) are within Pod Security baseline's."""
    types = _lit(sorted(trustzone.BASELINE_SELINUX_TYPES))
    return f"!{options}.?user.hasValue() && !{options}.?role.hasValue() && {options}.?type.orValue('') in {types}"


def _is_gpu_label(key: str) -> str:
    """Any value marks a GPU node (nodeaffinity.is_gpu_node_label, the one definition)."""
    prefixes = " || ".join(f"{key}.startsWith({_lit(prefix)})" for prefix in nodeaffinity.GPU_NODE_LABEL_PREFIXES)
    return (
        f"(!({key} in {_lit(sorted(nodeaffinity.GPU_NODE_TRUE_LABELS))}) && "
        f"({key} in {_lit(sorted(nodeaffinity.GPU_NODE_LABELS))} || {prefixes}))"
    )


def _is_true_label(key: str) -> str:
    """Only the value "true" marks a GPU node (nodeaffinity.GPU_NODE_TRUE_LABELS)."""
    return f"{key} in {_lit(sorted(nodeaffinity.GPU_NODE_TRUE_LABELS))}"


def _targets_gpu_nodes() -> str:
    positive = _lit(list(_POSITIVE_OPERATORS))
    expression = (
        f"({_is_gpu_label('e.key')} && e.operator in {positive}) || ({_is_true_label('e.key')} && "
        "(e.operator == 'Exists' || (e.operator == 'In' && e.?values.orValue([]).exists(v, v == 'true'))))"
    )
    affinity = "object.spec.?affinity.?nodeAffinity"
    selector = "object.spec.?nodeSelector.orValue({})"
    return (
        f"({selector}.exists(k, {_is_gpu_label('k')} || ({_is_true_label('k')} && {selector}[k] == 'true')) || "
        f"{affinity}.?requiredDuringSchedulingIgnoredDuringExecution.?nodeSelectorTerms.orValue([])"
        f".exists(t, t.?matchExpressions.orValue([]).exists(e, {expression})) || "
        f"{affinity}.?preferredDuringSchedulingIgnoredDuringExecution.orValue([])"
        f".exists(p, p.preference.?matchExpressions.orValue([]).exists(e, {expression})))"
    )


def selector_expression(selector: settings_.LabelSelector, *, labels: str) -> str:
    """CEL that is true where `labels` (a map expression) are selected, with Kubernetes semantics."""
    parts = [f"({_lit(k)} in {labels} && {labels}[{_lit(k)}] == {_lit(v)})" for k, v in selector.match_labels.items()]
    for requirement in selector.match_expressions:
        key, values = _lit(requirement.key), _lit(sorted(requirement.values))
        if requirement.operator == "In":
            parts.append(f"({key} in {labels} && {labels}[{key}] in {values})")
        elif requirement.operator == "NotIn":
            parts.append(f"(!({key} in {labels}) || !({labels}[{key}] in {values}))")
        elif requirement.operator == "Exists":
            parts.append(f"({key} in {labels})")
        else:
            parts.append(f"!({key} in {labels})")
    return " && ".join(parts) or "true"


_NAMESPACE_LABELS = "namespaceObject.metadata.?labels.orValue({})"


def _namespace_matches(match: settings_.NamespaceMatch) -> str:
    parts = []
    if match.names:
        parts.append(f"request.namespace in {_lit(sorted(match.names))}")
    if match.selector is not None:
        # the name label is set on every namespace; spelled out so a selector on it needs no namespaceObject
        parts.append(selector_expression(match.selector, labels=_NAMESPACE_LABELS))
    return "(" + " && ".join(parts or ["true"]) + ")"


def _exception_matches(exception: settings_.PolicyException) -> str:
    parts = []
    if exception.namespaces is not None:
        parts.append(_namespace_matches(exception.namespaces))
    if exception.names:
        name = (
            "(object.metadata.?name.orValue('') != '' ? object.metadata.name : object.metadata.?generateName.orValue('') + '*')"
        )
        pattern = "^(" + "|".join(_glob(p) for p in exception.names) + ")$"
        parts.append(f"{name}.matches({_lit(pattern)})")
    if exception.object_selector is not None:
        parts.append("(" + selector_expression(exception.object_selector, labels="object.metadata.?labels.orValue({})") + ")")
    return " && ".join(parts) or "true"


def _glob(pattern: str) -> str:
    out = []
    for char in pattern:
        if char == "*":
            out.append(".*")
        elif char == "?":
            out.append(".")
        elif char.isalnum() or char in "_":
            out.append(char)
        else:
            out.append("\\" + char)
    return "".join(out)


def _enforced_here(policy_id: str, settings: settings_.Settings) -> str | None:
    """CEL true where the policy acts `enforce` ("true" when everywhere), None when nowhere."""
    base = settings.action(policy_id) is model.Action.ENFORCE
    expression = "true" if base else "false"
    relevant = [o for o in settings.namespace_overrides if policy_id in o.actions]
    if not relevant:
        return "true" if base else None
    if not base and all(o.actions[policy_id] is not model.Action.ENFORCE for o in relevant):
        return None
    for override in reversed(relevant):  # the first matching override decides
        here = "true" if override.actions[policy_id] is model.Action.ENFORCE else "false"
        expression = f"({_namespace_matches(override.match)} ? {here} : {expression})"
    return expression


def _dns(name: str) -> str:
    cleaned = "".join(ch if ch.isalnum() else "-" for ch in name.lower()).strip("-")
    return cleaned[:50] or "unnamed"
