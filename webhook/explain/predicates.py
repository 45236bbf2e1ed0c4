"""kube-scheduler's own node checks that decide before the GPU extender is asked: cordon, taints,
nodeSelector and required node affinity, stated as `reasons.Reason`s.

The extender only sees the nodes that pass these (kube-scheduler filters with its plugins first, then
calls the extender), so `explain` has to name them itself. The semantics are kube-scheduler's
(kubernetes/kubernetes `pkg/scheduler/framework/plugins/nodeunschedulable`, `tainttoleration`,
`nodeaffinity`, and `component-helpers/scheduling/corev1/nodeaffinity`):
- `spec.unschedulable` (cordon) refuses a pod unless it tolerates `node.kubernetes.io/unschedulable`
  with effect `NoSchedule`;
- a taint with effect `NoSchedule` or `NoExecute` refuses a pod without a matching toleration
  (`PreferNoSchedule` only scores). A toleration matches when its effect is empty or equal, and its
  key is empty with `Exists` (everything) or equal, with `Exists` or an equal value (`Equal`, the
  default operator), as the Toleration type's field documentation states it (e.g. kubernetes-client/java
  `kubernetes/docs/V1Toleration.md`: an empty key with `Exists` matches every taint; an empty effect
  matches every effect);
- every `nodeSelector` entry must equal the node's label; of the required affinity's
  `nodeSelectorTerms` one must match, and inside a term every expression (`In`, `NotIn`, `Exists`,
  `DoesNotExist`, `Gt`, `Lt` on labels; `matchFields` on `metadata.name`). A term without
  expressions matches nothing.

A refused selector is a `CARD_MODEL` reason when every expression it fails is on a card-model label
(`aliyun.accelerator/nvidia_name`, `gpu-admission.io/gpu-memory-mib`: what GPU102 writes for pods whose
card the device plugin picks, or what a user wrote), and a `MODE_MISMATCH` reason otherwise (the mode
label, or any other selector). For pods the extender places, GPU102 writes no affinity: their
card-model annotations are judged per card by `placement.evaluate`, the function the extender
itself runs, so `explain` and `simulate` cannot disagree with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from policies import gpu, nodeaffinity, podspec
from policies.gpu import reasons

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
CARD_MODEL_KEYS = frozenset({gpu.CARD_NAME_LABEL, gpu.CARD_MEMORY_MIB_LABEL})


def check(pod: Mapping[str, Any], node: Mapping[str, Any]) -> tuple[reasons.Reason, ...]:
    """Why kube-scheduler itself would not put `pod` on `node` (empty: it would pass to the extender)."""
    spec = podspec.mapping(pod.get("spec"))
    found: list[reasons.Reason] = []
    found.extend(_schedulable(spec, node))
    found.extend(_selectors(spec, node))
    return tuple(found)


def _schedulable(spec: Mapping[str, Any], node: Mapping[str, Any]) -> list[reasons.Reason]:
    tolerations = [t for t in podspec.sequence(spec.get("tolerations")) if isinstance(t, Mapping)]
    node_spec = podspec.mapping(node.get("spec"))
    found: list[reasons.Reason] = []
    if node_spec.get("unschedulable") is True and not _tolerated(
        {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}, tolerations
    ):
        found.append(
            reasons.Reason(
                code=reasons.Code.UNSCHEDULABLE,
                message="the node is cordoned (spec.unschedulable); `kubectl uncordon` it to take new pods",
            )
        )
    for taint in podspec.sequence(node_spec.get("taints")):
        if not isinstance(taint, Mapping) or taint.get("effect") not in BLOCKING_EFFECTS:
            continue
        if taint.get("key") == UNSCHEDULABLE_TAINT and node_spec.get("unschedulable") is True:
            continue  # the cordon's own taint: said above
        if not _tolerated(taint, tolerations):
            shown = f"{taint.get('key', '')}{'=' + str(taint['value']) if taint.get('value') else ''}:{taint.get('effect')}"
            found.append(
                reasons.Reason(
                    code=reasons.Code.UNSCHEDULABLE,
                    message=f"the node has the taint {shown}, which the pod does not tolerate",
                )
            )
    return found


def _tolerated(taint: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        operator = toleration.get("operator") or "Equal"
        key = toleration.get("key") or ""
        if not key:
            if operator == "Exists":
                return True
            continue
        if key != taint.get("key"):
            continue
        if operator == "Exists" or (operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")):
            return True
    return False


def _selectors(spec: Mapping[str, Any], node: Mapping[str, Any]) -> list[reasons.Reason]:
    metadata = podspec.mapping(node.get("metadata"))
    labels = {str(k): str(v) for k, v in podspec.mapping(metadata.get("labels")).items()}
    name = str(metadata.get("name", ""))
    found: list[reasons.Reason] = []
    for key, wanted in nodeaffinity.node_selector(spec).items():
        if labels.get(str(key)) != str(wanted):
            has = f'has {key}="{labels[str(key)]}"' if str(key) in labels else f"has no {key} label"
            found.append(_selector_reason([str(key)], f'nodeSelector {key}="{wanted}": the node {has}'))
    terms = list(nodeaffinity.required_terms(spec))
    required = podspec.mapping(nodeaffinity.node_affinity(spec).get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not terms and "nodeSelectorTerms" not in required:
        return found
    failures: list[tuple[list[str], str]] = []
    for term in terms:
        failed = _term_failures(term, labels=labels, name=name)
        if not failed:
            return found  # one matching term is enough
        failures.append(
            failed[0] if len(failed) == 1 else ([k for keys, _ in failed for k in keys], "; ".join(m for _, m in failed))
        )
    if not failures:
        failures.append((["<none>"], "the required node affinity has no usable term"))
    keys = [k for keys, _ in failures for k in keys]
    found.append(_selector_reason(keys, "required node affinity: " + " | ".join(message for _, message in failures)))
    return found


def _selector_reason(keys: Sequence[str], message: str) -> reasons.Reason:
    code = reasons.Code.CARD_MODEL if keys and all(k in CARD_MODEL_KEYS for k in keys) else reasons.Code.MODE_MISMATCH
    return reasons.Reason(code=code, message=message)


def _term_failures(term: Mapping[str, Any], *, labels: Mapping[str, str], name: str) -> list[tuple[list[str], str]]:
    """The expressions of one nodeSelectorTerm the node fails, as ([key], sentence)."""
    failed: list[tuple[list[str], str]] = []
    expressions = list(nodeaffinity.expressions(term))
    fields = [f for f in podspec.sequence(term.get("matchFields")) if isinstance(f, Mapping)]
    if not expressions and not fields:
        return [(["<empty>"], "an empty nodeSelectorTerm matches no node")]
    for expression in expressions:
        key = str(expression.get("key", ""))
        if not _matches(expression, labels.get(key), present=key in labels):
            failed.append(([key], f"{_show(expression)} (the node has {_value(labels, key)})"))
    for field in fields:
        if field.get("key") != "metadata.name" or not _matches(field, name, present=True):
            failed.append(([str(field.get("key", ""))], f"matchFields {_show(field)} (the node is {name})"))
    return failed


def _matches(expression: Mapping[str, Any], value: str | None, *, present: bool) -> bool:
    operator = expression.get("operator")
    values = [str(v) for v in podspec.sequence(expression.get("values"))]
    if operator == "In":
        return present and value in values
    if operator == "NotIn":
        return not present or value not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, bound = int(str(value)), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _show(expression: Mapping[str, Any]) -> str:
    values = ",".join(str(v) for v in podspec.sequence(expression.get("values")))
    return (
        f"{expression.get('key')} {expression.get('operator')} [{values}]"
        if values
        else f"{expression.get('key')} {expression.get('operator')}"
    )


def _value(labels: Mapping[str, str], key: str) -> str:
    return f'{key}="{labels[key]}"' if key in labels else f"no {key} label"
