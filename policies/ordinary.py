"""Ordinary pods: the pod CREATEs no built-in policy can refuse or warn on, as one CEL expression.

The validating webhook's match condition `pod-create-not-ordinary` (deploy/webhook-configurations.yaml)
is `condition_expression()`: kube-apiserver evaluates it on the pod as it stands after every
mutating webhook (ours included: GPU104's `NVIDIA_VISIBLE_DEVICES=void` is already there) and calls
/validate only when it is true. It is false, and the call is skipped, only for a pod CREATE (no
subresource) where every one of these holds:

- no container of any kind (regular, init and sidecar; ephemeral containers must be absent) names
  a resource under `nvidia.com/` or `aliyun.com/` in limits or requests (GPU002, GPU004, GPU005,
  GPU008: each judges only pods that request a GPU or an extender-managed resource);
- no container is `privileged: true`, adds any capability, or sets a procMount other than
  `Default`, seLinuxOptions or windowsOptions, and the pod sets no host namespace and no
  seLinuxOptions or windowsOptions in its securityContext (GPU002, GPU009: the trust zone's
  privileges; every added capability sends the review, the simplest superset);
- every volume is of a type the trust zone allows by default (`trustzone.DEFAULT_VOLUME_TYPES`): no
  hostPath, gitRepo, flexVolume, ... (GPU003);
- no volumeMount or volumeDevice path holding `nvidia-container-devices` (GPU006 reads no path
  without that name);
- every environment entry with a guarded name (`gpu.GUARDED_ENV`) is `NVIDIA_VISIBLE_DEVICES` with
  the literal value `void` or `none` and no `valueFrom` (GPU001), and no container has `envFrom`
  (GPU001 judges a source without a prefix by looking it up, or warns where GPU007 does not guard
  the namespace: every `envFrom` sends the review);
- no annotation is an allocation key, a device-injection key, a CRI-O devices key, or any key under
  `gpu-admission.io/` (GPU008, GPU010, and GPU102's card-model annotations, whose malformed values
  are problems reported at validation);
- no `spec.nodeName` (GPU008; it only matters beside extender resources, excluded above anyway);
- no container port with a `hostPort` (GPU002, GPU103: a host port off the allowlist is node power;
  every host port sends the review, the simplest superset, and /validate judges it);
- no nodeSelector key and no node-affinity expression key (required or preferred) that is a GPU
  node label (`nodeaffinity.GPU_NODE_LABELS`, `GPU_NODE_TRUE_LABELS`, `GPU_NODE_LABEL_PREFIXES`),
  whatever its operator or value (GPU002 and GPU005 read them).

Everything else (pod UPDATEs, `pods/ephemeralcontainers`, workloads, any other resource) is sent as
before. Every field access is guarded with `has()`, so the expression cannot fail on a valid pod
(an error would refuse the pod under `failurePolicy: Fail`). The lists come from the constants
above, so there is no second copy to keep; a unit test holds the YAML equal to this function. The
length budget is the project's own (`cel.MAX_EXPRESSION_CHARS`, the bound on user policies, which a
unit test holds the condition to): kube-apiserver's CEL base environment (kubernetes
`staging/src/k8s.io/apiserver/pkg/cel/environment/base.go`) sets no expression size limit of its
own, only a runtime cost limit per call.

The skip is sound only for the built-in policies under settings that cannot make them speak about
such a pod: `unsound_reasons(settings)` names what breaks it. User CEL policies can refuse anything,
and a mutator acting `warn` or `audit` (GPU104, or GPU103 with keepNonGpuPodsOffGpuNodes) reports
"would have ..." on every pod at validation only. With either configured the condition must be
sent again: /mutate, which reads the live settings, then marks every pod it creates with
`REVIEW_ANNOTATION` (`review_mark`), a key the condition never skips, so the skip switches itself off
with no change to the registration. `without_ordinary_condition` removes the condition outright.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from policies import builtin, gpu, model, nodeaffinity, policy, trustzone
from policies import settings as settings_
from policies.builtin import gpu006_device_list_mounts

CONDITION_NAME = "pod-create-not-ordinary"
VALIDATING_WEBHOOK = "validate.gpu-admission.io"

# Resource-name prefixes whose presence sends the review: NVIDIA's domain, and the domain of every
# GPU resource the project names (aliyun.com/gpu-mem, ...).
RESOURCE_PREFIXES: tuple[str, ...] = tuple(
    sorted({gpu.NVIDIA_RESOURCE_PREFIX, *(str(r).split("/", 1)[0] + "/" for r in gpu.GPU_RESOURCES)})
)
DEVICE_LIST_NAME = gpu006_device_list_mounts.DEVICE_LIST_ROOT.rsplit("/", 1)[1]
# The values GPU001 always accepts whatever the settings (trimmed and lower-cased, so these exact
# spellings pass); the mutation writes one of them (settings.NEUTRAL_VISIBLE_DEVICES_CHOICES).
NEUTRAL_VALUES: tuple[str, ...] = tuple(sorted(gpu.VISIBLE_DEVICES_SAFE_VALUES))
NODE_LABEL_PREFIXES: tuple[str, ...] = tuple(nodeaffinity.GPU_NODE_LABEL_PREFIXES)
# A label that one of the prefixes already covers (nvidia.com/gpu.present) is not listed again.
NODE_LABELS: tuple[str, ...] = tuple(
    sorted(k for k in nodeaffinity.GPU_NODE_LABELS | nodeaffinity.GPU_NODE_TRUE_LABELS if not k.startswith(NODE_LABEL_PREFIXES))
)
# Supersets, kept short (the condition has a length budget): the allocation keys by their common
# prefix, the device-annotation entries that are not CDI/NRI domains by their domain or prefix.
_ALLOCATION_PREFIX = "ALIYUN_COM_GPU_MEM_"
DEVICE_DOMAINS: tuple[str, ...] = tuple(d for d in gpu.DEVICE_ANNOTATION_DOMAINS if "/" not in d and not d.endswith("."))
ANNOTATION_KEYS: tuple[str, ...] = gpu.CRIO_DEVICES_ANNOTATIONS
ANNOTATION_PREFIXES: tuple[str, ...] = tuple(
    dict.fromkeys(
        [
            gpu.OWN_PREFIX,
            _ALLOCATION_PREFIX,
            *(d.split("/", 1)[0] + "/" if "/" in d else d for d in gpu.DEVICE_ANNOTATION_DOMAINS if d not in DEVICE_DOMAINS),
        ]
    )
)


def _list(values: Iterable[str]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _optional_all(path: str, var: str, body: str) -> str:
    """`body` holds for every element (list) or key (map) at `path`, true when the field is absent."""
    return f"(!has({path}) || {path}.all({var}, {body}))"


def _gpu_label(key: str) -> str:
    return f"({key} in {_list(NODE_LABELS)} || {_list(NODE_LABEL_PREFIXES)}.exists(p, {key}.startsWith(p)))"


def _container_ok(c: str) -> str:
    gpu_resource = f"{_list(RESOURCE_PREFIXES)}.exists(p, r.startsWith(p))"
    resources = (
        f"(!has({c}.resources) || ({_optional_all(f'{c}.resources.limits', 'r', f'!{gpu_resource}')} && "
        f"{_optional_all(f'{c}.resources.requests', 'r', f'!{gpu_resource}')}))"
    )
    sc = f"{c}.securityContext"
    security = (
        f"(!has({sc}) || ((!has({sc}.privileged) || {sc}.privileged != true) && (!has({sc}.capabilities) || "
        f"!has({sc}.capabilities.add) || size({sc}.capabilities.add) == 0) && "
        f"(!has({sc}.procMount) || {sc}.procMount == 'Default') && !has({sc}.seLinuxOptions) && "
        f"!has({sc}.windowsOptions)))"
    )
    env = _optional_all(
        f"{c}.env",
        "e",
        f"!(e.name in {_list(sorted(gpu.GUARDED_ENV))}) || (e.name == '{gpu.VISIBLE_DEVICES_ENV}' && "
        f"!has(e.valueFrom) && has(e.value) && e.value in {_list(NEUTRAL_VALUES)})",
    )
    env_from = f"(!has({c}.envFrom) || size({c}.envFrom) == 0)"
    mounts = _optional_all(f"{c}.volumeMounts", "m", f"!has(m.mountPath) || !m.mountPath.contains('{DEVICE_LIST_NAME}')")
    devices = _optional_all(f"{c}.volumeDevices", "m", f"!has(m.devicePath) || !m.devicePath.contains('{DEVICE_LIST_NAME}')")
    # Any host port sends the review, the simplest superset: /validate judges it against the allowlist.
    host_ports = _optional_all(f"{c}.ports", "p", "!has(p.hostPort) || p.hostPort == 0")
    return " && ".join((resources, security, env, env_from, mounts, devices, host_ports))


def _affinity_ok() -> str:
    """No GPU node label in a required term or a preferred term's preference, both NodeSelectorTerms:
    one list of terms, so the label test is written once (the condition has a length budget)."""
    na = "object.spec.affinity.nodeAffinity"
    req = f"{na}.requiredDuringSchedulingIgnoredDuringExecution"
    pref = f"{na}.preferredDuringSchedulingIgnoredDuringExecution"
    terms = (
        f"((has({req}) && has({req}.nodeSelectorTerms) ? {req}.nodeSelectorTerms : []) + "
        f"(has({pref}) ? {pref}.filter(t, has(t.preference)).map(t, t.preference) : []))"
    )
    keys_ok = f"!has(e.key) || !{_gpu_label('e.key')}"
    return f"(!has(object.spec.affinity) || !has({na}) || {terms}.all(t, {_optional_all('t.matchExpressions', 'e', keys_ok)}))"


def ordinary_expression() -> str:
    """CEL, true when `object` (a Pod) is ordinary: no built-in policy can refuse or warn on it."""
    spec = "object.spec"
    annotation_ok = (
        f"!(k in {_list(ANNOTATION_KEYS)}) && !{_list(ANNOTATION_PREFIXES)}.exists(p, k.startsWith(p)) && "
        f"!{_list(DEVICE_DOMAINS)}.exists(d, k == d || k.startsWith(d + '/'))"
    )
    parts = (
        f"(!has({spec}.ephemeralContainers) || size({spec}.ephemeralContainers) == 0)",
        f"(!has({spec}.nodeName) || {spec}.nodeName == '')",
        _optional_all(f"{spec}.volumes", "v", " || ".join(f"has(v.{kind})" for kind in sorted(trustzone.DEFAULT_VOLUME_TYPES))),
        *(f"(!has({spec}.{field}) || {spec}.{field} != true)" for field in trustzone.HOST_NAMESPACES),
        f"(!has({spec}.securityContext) || (!has({spec}.securityContext.seLinuxOptions) && "
        f"!has({spec}.securityContext.windowsOptions)))",
        _optional_all("object.metadata.annotations", "k", annotation_ok),
        _optional_all(f"{spec}.nodeSelector", "k", f"!{_gpu_label('k')}"),
        _affinity_ok(),
        f"((has({spec}.containers) ? {spec}.containers : []) + "
        f"(has({spec}.initContainers) ? {spec}.initContainers : [])).all(c, {_container_ok('c')})",
    )
    return "(" + " && ".join(parts) + ")"


def condition_expression() -> str:
    """The match condition: true (send the review) unless the request is an ordinary pod's CREATE."""
    return (
        "request.resource.resource != 'pods' || request.operation != 'CREATE' || "
        "(has(request.subResource) && request.subResource != '') || !has(object.spec) || "
        f"!{ordinary_expression()}"
    )


def _mutators() -> tuple[policy.Policy, ...]:
    return tuple(p for p in builtin.POLICIES if isinstance(p, policy.Mutator))


def unsound_reasons(settings: settings_.Settings) -> tuple[str, ...]:
    """Why skipping ordinary pods could change a verdict under `settings`; () when it cannot.

    A validator's action never matters (no built-in validator finds anything in an ordinary pod) and
    exceptions only skip policies. What matters: user policies (they can refuse anything), and a
    mutator acting `warn` or `audit` somewhere, which reports at validation what it would have added.
    """
    reasons: list[str] = []
    if settings.user_policies:
        names = ", ".join(p.id for p in settings.user_policies)
        reasons.append(f"user policies are configured ({names}): they can refuse any pod")
    quiet = (model.Action.WARN, model.Action.AUDIT)
    for mutator in _mutators():
        actions = {settings.action(mutator.id)}
        actions.update(o.actions[mutator.id] for o in settings.namespace_overrides if mutator.id in o.actions)
        found = sorted(str(a) for a in actions if a in quiet)
        if found:
            reasons.append(f"mutator {mutator.id} acts {'/'.join(found)}: it reports at validation only")
    return tuple(reasons)


# The mark /mutate adds to every pod CREATE while `unsound_reasons` is not empty: a key under
# `gpu-admission.io/`, which the condition treats as not ordinary, so kube-apiserver sends the review
# again. The webhook follows its live settings, so the skip switches itself off the moment user
# policies or a quiet mutator are configured, with no change to the registration. No policy reads it.
REVIEW_ANNOTATION = gpu.OWN_PREFIX + "validate"
REVIEW_VALUE = "required"

_cached: tuple[settings_.Settings | None, tuple[str, ...]] = (None, ())


def cached_unsound_reasons(settings: settings_.Settings) -> tuple[str, ...]:
    """`unsound_reasons`, computed once per settings object (the live settings change rarely)."""
    global _cached  # noqa: PLW0603 - a one-entry cache keyed by identity
    known, reasons = _cached
    if known is not settings:
        reasons = unsound_reasons(settings)
        _cached = (settings, reasons)
    return reasons


def review_mark(obj: Mapping[str, Any] | None) -> tuple[dict[str, Any], ...]:
    """The JSON patch that adds `REVIEW_ANNOTATION` to a pod; () when it is there already."""
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    if not isinstance(metadata, Mapping):
        return ()
    if isinstance(annotations, Mapping):
        if annotations.get(REVIEW_ANNOTATION) == REVIEW_VALUE:
            return ()
        key = REVIEW_ANNOTATION.replace("~", "~0").replace("/", "~1")
        return ({"op": "add", "path": f"/metadata/annotations/{key}", "value": REVIEW_VALUE},)
    return ({"op": "add", "path": "/metadata/annotations", "value": {REVIEW_ANNOTATION: REVIEW_VALUE}},)


def without_ordinary_condition(document: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a webhook configuration document with the ordinary-pod condition removed (others kept)."""
    copied = dict(document)
    if copied.get("kind") != "ValidatingWebhookConfiguration":
        return copied
    hooks = []
    for hook in copied.get("webhooks") or []:
        hook = dict(hook)
        conditions = [c for c in hook.get("matchConditions") or [] if c.get("name") != CONDITION_NAME]
        if "matchConditions" in hook:
            hook["matchConditions"] = conditions
        hooks.append(hook)
    copied["webhooks"] = hooks
    return copied
