"""MutatingAdmissionPolicy export: GPU104's ``NVIDIA_VISIBLE_DEVICES=void`` injection run inside kube-apiserver.

``export(settings, now=...)`` returns a MutatingAdmissionPolicy and its binding
(``admissionregistration.k8s.io/v1beta1``, Kubernetes 1.34: the ``MutatingAdmissionPolicy`` feature
gate and ``--runtime-config=admissionregistration.k8s.io/v1beta1=true`` on kube-apiserver), named
``gpu-admission-gpu104``. It adds to every regular and init container of a pod CREATE that
mentions no GPU resource (``gpu.is_gpu_resource`` on the keys of its limits and requests) and whose
``env`` does not name the variable the entry ``{name: NVIDIA_VISIBLE_DEVICES, value: <neutral>}``
(``visibleDevicesNeutralValue``, ``void`` by default), as an apply configuration: ``env`` and
``containers`` are lists keyed by name, so the entry is merged in beside what the container already
has and a second application changes nothing. A match condition sends only pods with at least one
such container, so an already-mutated pod (or a GPU pod without sidecars) costs no mutation at all.

The same scope as the webhook's GPU104 (``policies/builtin/gpu104_void_devices.py``): left out
where GPU104 is not ``enforce`` (namespace overrides become a match condition), exceptions that
have not expired leave their pods out (as for the ValidatingAdmissionPolicies, CEL has no clock:
export again once one expires), exempt namespaces are left out by the binding, a kubelet's mirror
pods by a match condition. Ephemeral containers (the ``pods/ephemeralcontainers`` subresource) stay
the webhook's: it still receives those updates.

With this policy in place the mutating webhook has nothing left to do for an ordinary pod
(``policies.ordinary``), so it can skip ordinary pod CREATEs with the same match condition the
validating webhook carries (``webhook_condition()``); then such a pod costs no webhook call at
all. ``skip_reasons(settings)`` says when that skip would change a result: where user policies or a
quiet mutator need the webhook's review mark, or GPU103 keeps every non-GPU pod off GPU nodes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from policies import builtin, gpu, model, ordinary, trustzone
from policies import settings as settings_
from webhook import config
from webhook.cmdline import flags, output
from webhook.commands import vap

API_VERSION = "admissionregistration.k8s.io/v1beta1"
POLICY_ID = "GPU104"
NAME = vap.PREFIX + "gpu104"
OUTPUTS = ("yaml", "json")
# The container lists a pod CREATE can carry (ephemeral containers come by the subresource only).
_LISTS = ("containers", "initContainers")
_POD_CREATE = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"}


def needs_void(c: str, zone: trustzone.TrustZone = trustzone.DEFAULT_ZONE) -> str:
    """CEL over container `c`: true when GPU104 adds the entry (no GPU resource, variable not named)."""
    is_gpu = vap._is_gpu_resource("r", zone)
    mentions_gpu = " || ".join(f"{c}.?resources.?{part}.orValue({{}}).exists(r, {is_gpu})" for part in ("limits", "requests"))
    return f"!({mentions_gpu}) && !{c}.?env.orValue([]).exists(e, e.name == {vap._lit(gpu.VISIBLE_DEVICES_ENV)})"


def _variable(name: str) -> str:
    return f"{name}NeedingVoid"


def variables(zone: trustzone.TrustZone = trustzone.DEFAULT_ZONE) -> list[dict[str, str]]:
    """Per container list, the containers that need the entry (the mutation reads these)."""
    return [
        {"name": _variable(name), "expression": f"object.spec.?{name}.orValue([]).filter(c, {needs_void('c', zone)})"}
        for name in _LISTS
    ]


def mutation_expression(neutral: str) -> str:
    """The apply configuration: the env entry for every container that needs it, list by list.

    A list none of whose containers needs it is left out of the configuration (an optional field),
    so the merge never touches it."""
    fields = []
    for name in _LISTS:
        found = f"variables.{_variable(name)}"
        entry = f"Object.spec.{name}.env{{name: {vap._lit(gpu.VISIBLE_DEVICES_ENV)}, value: {vap._lit(neutral)}}}"
        fields.append(
            f"?{name}: size({found}) > 0 ? "
            f"optional.of({found}.map(c, Object.spec.{name}{{name: c.name, env: [{entry}]}})) : optional.none()"
        )
    return "Object{spec: Object.spec{" + ", ".join(fields) + "}}"


def condition(zone: trustzone.TrustZone = trustzone.DEFAULT_ZONE) -> str:
    """Match condition: some regular or init container of the pod needs the entry (match conditions
    see no variables, so the test is spelled out)."""
    return " || ".join(f"object.spec.?{name}.orValue([]).exists(c, {needs_void('c', zone)})" for name in _LISTS)


def export(settings: settings_.Settings, *, now: datetime.datetime) -> vap.Export:
    """The MutatingAdmissionPolicy and binding for GPU104 under `settings`; none where it never enforces."""
    enforced = vap._enforced_here(POLICY_ID, settings)
    if enforced is None:
        return vap.Export(manifests=(), notes=(f"{POLICY_ID}: left out: its action is not enforce in any namespace",))
    notes: list[str] = []
    conditions: list[dict[str, str]] = [
        {"name": "not-a-mirror-pod", "expression": vap.MIRROR_POD},
        {"name": "a-container-needs-the-neutral-value", "expression": condition(settings.trust_zone)},
    ]
    if enforced != "true":
        conditions.append({"name": "enforced-in-this-namespace", "expression": enforced})
    for index, exception in enumerate(settings.exceptions):
        if POLICY_ID not in exception.policies or exception.expired(now):
            continue
        conditions.append(
            {
                "name": f"exception-{index}-{vap._dns(exception.name)}"[:63].rstrip("-"),
                "expression": f"!({vap._exception_matches(exception)})",
            }
        )
        if exception.expires is not None:
            notes.append(
                f"{POLICY_ID}: exception {exception.name} expires {exception.expires.isoformat()}; export again after that, the apiserver cannot tell"
            )
    reasons = skip_reasons(settings)
    if reasons:
        notes.append("the mutating webhook must keep receiving ordinary pods: " + "; ".join(reasons))
    else:
        notes.append(
            "the mutating webhook may now skip ordinary pod CREATEs: give it the validating webhook's "
            f"match condition {ordinary.CONDITION_NAME}"
        )
    summary = {p.id: p.summary for p in builtin.POLICIES}[POLICY_ID]
    labels = {"app.kubernetes.io/name": "gpu-admission", "app.kubernetes.io/component": "mutating-admission-policy"}
    policy = {
        "apiVersion": API_VERSION,
        "kind": "MutatingAdmissionPolicy",
        "metadata": {
            "name": NAME,
            "labels": labels,
            "annotations": {
                "gpu-admission.io/policy-id": POLICY_ID,
                "gpu-admission.io/source": "built-in",
                "gpu-admission.io/summary": summary,
            },
        },
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [dict(_POD_CREATE)]},
            "matchConditions": conditions,
            "reinvocationPolicy": "IfNeeded",
            "variables": variables(settings.trust_zone),
            "mutations": [
                {
                    "patchType": "ApplyConfiguration",
                    "applyConfiguration": {"expression": mutation_expression(settings.visible_devices_neutral_value)},
                }
            ],
        },
    }
    binding_spec: dict[str, Any] = {"policyName": NAME}
    if settings.exempt_namespaces:
        binding_spec["matchResources"] = {
            "namespaceSelector": {
                "matchExpressions": [
                    {"key": settings_.NAMESPACE_NAME_LABEL, "operator": "NotIn", "values": sorted(settings.exempt_namespaces)}
                ]
            }
        }
    binding = {
        "apiVersion": API_VERSION,
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": NAME, "labels": labels},
        "spec": binding_spec,
    }
    return vap.Export(manifests=(policy, binding), notes=tuple(notes))


def skip_reasons(settings: settings_.Settings) -> tuple[str, ...]:
    """Why the mutating webhook may not skip ordinary pod CREATEs under `settings` ((): it may)."""
    reasons = list(ordinary.unsound_reasons(settings))
    gpu103 = {settings.action("GPU103"), *(o.actions["GPU103"] for o in settings.namespace_overrides if "GPU103" in o.actions)}
    if settings.keep_non_gpu_pods_off_gpu_nodes and any(a is not model.Action.OFF for a in gpu103):
        reasons.append("keepNonGpuPodsOffGpuNodes: GPU103 changes every pod that asks for no GPU")
    return tuple(reasons)


def webhook_condition() -> dict[str, str]:
    """The match condition that lets the mutating webhook skip ordinary pod CREATEs (the validating one's)."""
    return {"name": ordinary.CONDITION_NAME, "expression": ordinary.condition_expression()}


def with_webhook_condition(document: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a webhook configuration document whose mutating webhooks skip ordinary pod CREATEs
    (`webhook_condition()` added where absent; any other document unchanged)."""
    copied = dict(document)
    if copied.get("kind") != "MutatingWebhookConfiguration":
        return copied
    hooks = []
    for hook in copied.get("webhooks") or []:
        hook = dict(hook)
        conditions = [dict(c) for c in hook.get("matchConditions") or []]
        if all(c.get("name") != ordinary.CONDITION_NAME for c in conditions):
            conditions.append(webhook_condition())
        hook["matchConditions"] = conditions
        hooks.append(hook)
    copied["webhooks"] = hooks
    return copied


def render(manifests: Iterable[Mapping[str, Any]]) -> str:
    """The manifests as one multi-document YAML stream, ready for ``kubectl apply -f``."""
    header = "# Generated by `gpu-admission policies export-map`; edit the settings and export again.\n"
    return header + yaml.safe_dump_all(
        [json.loads(json.dumps(m)) for m in manifests], sort_keys=False, explicit_start=True, width=1000
    )


# --- command -------------------------------------------------------------------------------------


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``policies export-map``: the same flags as ``export-vap``."""
    parser = commands.add_parser(
        "export-map",
        help="write GPU104 as a MutatingAdmissionPolicy + binding (admissionregistration.k8s.io/v1beta1)",
        description="Write GPU104's NVIDIA_VISIBLE_DEVICES injection as a MutatingAdmissionPolicy with its binding "
        "(Kubernetes 1.34: the MutatingAdmissionPolicy feature gate and admissionregistration.k8s.io/v1beta1 enabled).",
    )
    parser.add_argument("--policies-dir", metavar="DIR", help="directory of GpuAdmissionPolicy YAML files")
    parser.add_argument("--config", metavar="FILE", help="settings YAML (actions, overrides, exceptions, exempt namespaces)")
    flags.add_output(parser, OUTPUTS, default="yaml")  # yaml: a multi-document stream; json: a v1 List
    flags.add_output_file(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    loaded = config.load(args.config, policies_dir=args.policies_dir)
    exported = export(loaded, now=datetime.datetime.now(datetime.UTC))
    for note in exported.notes:
        print(f"note: {note}", file=sys.stderr)
    if args.output == "json":
        text = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(exported.manifests)}, indent=2) + "\n"
    else:
        text = render(exported.manifests)
    output.emit(text, path=args.output_file)
    if output.to_file(args.output_file):
        print(f"wrote {len(exported.manifests)} manifests to {args.output_file}", file=sys.stderr)
    return 0
