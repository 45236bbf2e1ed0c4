"""Reading a pod's node constraints (nodeSelector, node affinity) and adding required expressions.

Kubernetes semantics used here: `nodeSelector` entries and the expressions inside one
`nodeSelectorTerm` are ANDed; the terms of `requiredDuringSchedulingIgnoredDuringExecution` are ORed.
So a requirement added to a pod with terms must go into EVERY term, or one term would still let the
pod through without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from policies import gpu, patching, podspec

_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"

# A node without `ack.node.gpu.schedule` behaves as `default` (exclusive scheduling).
UNLABELLED = ""
_ALL_MODES: frozenset[str] = frozenset(gpu.Mode) | {UNLABELLED}
_POSITIVE_OPERATORS = frozenset({"In", "Exists", "Gt", "Lt"})


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModeConstraint:
    """Which `ack.node.gpu.schedule` values a pod's nodeSelector and required affinity allow."""

    allowed: frozenset[str]  # Mode values, and UNLABELLED for nodes without the label
    source: str  # "nodeSelector ack.node.gpu.schedule=topology" or "required node affinity ..."


def node_selector(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pod's nodeSelector (empty where absent or malformed)."""
    return podspec.mapping(spec.get("nodeSelector"))


def node_affinity(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    """The pod's `affinity.nodeAffinity` (empty where absent or malformed)."""
    return podspec.mapping(podspec.mapping(spec.get("affinity")).get("nodeAffinity"))


def required_terms(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """The well-formed nodeSelectorTerms of the required node affinity."""
    required = podspec.mapping(node_affinity(spec).get(_REQUIRED))
    for term in podspec.sequence(required.get("nodeSelectorTerms")):
        if isinstance(term, Mapping):
            yield term


def expressions(term: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """The well-formed matchExpressions of one nodeSelectorTerm."""
    for expression in podspec.sequence(term.get("matchExpressions")):
        if isinstance(expression, Mapping):
            yield expression


def _preferred_terms(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for item in podspec.sequence(node_affinity(spec).get(_PREFERRED)):
        preference = podspec.mapping(podspec.mapping(item).get("preference"))
        if preference:
            yield preference


# --- which node labels mark GPU nodes (the one definition; GPU002, GPU103 and the audit use it) ---

# ACK's and our own labels: any value marks a GPU node.
GPU_NODE_LABELS: frozenset[str] = frozenset({gpu.SCHEDULE_LABEL, gpu.PLACEMENT_LABEL, gpu.CARD_MEMORY_MIB_LABEL})
GPU_NODE_LABEL_PREFIXES: tuple[str, ...] = (
    gpu.ACCELERATOR_LABEL_PREFIX,
    # The NVIDIA GPU Operator's per-operand switches (nvidia.com/gpu.deploy.driver, .device-plugin,
    # .dcgm-exporter, ...): its node-labelling controller sets them on GPU nodes only and removes
    # them when a node has no GPU left (gpu-operator controllers/state_manager.go, gpuStateLabels),
    # and its DaemonSets select on them (assets/state-*/..._daemonset.yaml nodeSelector). GPU Feature
    # Discovery's card labels (nvidia.com/gpu.product, .count, .memory, ...; nvidia.com/cuda.driver.*)
    # are written by its DaemonSet, which runs on GPU nodes only.
    "nvidia.com/gpu.",
    "nvidia.com/cuda.",
)
# Labels that mark a GPU node only with the value "true": node-feature-discovery's NVIDIA PCI
# vendor (10de) labels, and the GPU Operator's common label, which it sets to "true" from them and
# to "false" on a node whose GPUs are gone (gpu-operator controllers/state_manager.go gpuNodeLabels,
# controllers/nodelabeling_controller.go reconcileCommonGPULabel).
GPU_NODE_TRUE_LABELS: frozenset[str] = frozenset(
    {
        "nvidia.com/gpu.present",
        "feature.node.kubernetes.io/pci-10de.present",
        "feature.node.kubernetes.io/pci-0302_10de.present",
        "feature.node.kubernetes.io/pci-0300_10de.present",
    }
)
_TRUE = "true"


def is_gpu_node_label(key: object, value: object = None) -> bool:
    """Whether a node label marks a GPU node.

    `value` matters only for `GPU_NODE_TRUE_LABELS`: there `"true"` marks a GPU node and anything
    else does not; without a value (None) such a key counts, since it may be `"true"`.
    """
    if not isinstance(key, str):
        return False
    if key in GPU_NODE_TRUE_LABELS:
        return value is None or value == _TRUE
    return key in GPU_NODE_LABELS or key.startswith(GPU_NODE_LABEL_PREFIXES)


def _expression_targets_gpu_nodes(expression: Mapping[str, Any]) -> bool:
    key, operator = expression.get("key"), expression.get("operator")
    if not is_gpu_node_label(key) or operator not in _POSITIVE_OPERATORS:
        return False
    if key in GPU_NODE_TRUE_LABELS:
        # In must allow "true"; Gt/Lt never match "true"; Exists also matches the "true" nodes.
        return operator == "Exists" or (operator == "In" and _TRUE in _values(expression))
    return True


def targets_gpu_nodes(spec: Mapping[str, Any]) -> bool:
    """Whether the pod asks for GPU nodes: a nodeSelector on a GPU label, or an affinity
    expression (required or preferred) that only GPU-labelled nodes can satisfy.

    `NotIn` and `DoesNotExist` do not count: nodes without the label satisfy them. For the labels
    that mark GPU nodes only as `"true"` (`GPU_NODE_TRUE_LABELS`), a nodeSelector or `In` must ask
    for `"true"` (`nvidia.com/gpu.present: "false"` selects nodes without GPUs).
    """
    if any(is_gpu_node_label(key, value) for key, value in node_selector(spec).items()):
        return True
    return any(
        _expression_targets_gpu_nodes(expression)
        for term in (*required_terms(spec), *_preferred_terms(spec))
        for expression in expressions(term)
    )


def constrains(spec: Mapping[str, Any], key: str) -> bool:
    """Whether the pod's nodeSelector or any required affinity term says something about `key`."""
    if node_selector(spec).get(key) is not None:
        return True
    return any(expression.get("key") == key for term in required_terms(spec) for expression in expressions(term))


def _values(expression: Mapping[str, Any]) -> frozenset[str]:
    return frozenset(str(value) for value in podspec.sequence(expression.get("values")))


def _modes_of_expression(expression: Mapping[str, Any]) -> frozenset[str]:
    operator = expression.get("operator")
    if operator == "In":
        return _values(expression) & _ALL_MODES
    if operator == "NotIn":
        return _ALL_MODES - _values(expression)
    if operator == "Exists":
        return _ALL_MODES - {UNLABELLED}
    if operator == "DoesNotExist":
        return frozenset({UNLABELLED})
    if operator in ("Gt", "Lt"):
        return frozenset()  # mode names are not integers, so no node matches
    return _ALL_MODES  # an unknown operator: the apiserver refuses it, we do not guess


def mode_constraint(spec: Mapping[str, Any]) -> ModeConstraint | None:
    """What the pod's nodeSelector and required affinity allow for `ack.node.gpu.schedule`.

    None where neither says anything about the label.
    """
    constraints: list[ModeConstraint] = []
    selected = node_selector(spec).get(gpu.SCHEDULE_LABEL)
    if selected is not None:
        constraints.append(
            ModeConstraint(
                allowed=frozenset({str(selected)}) & _ALL_MODES - {UNLABELLED},
                source=f"nodeSelector {gpu.SCHEDULE_LABEL}={selected}",
            )
        )
    terms = list(required_terms(spec))
    if any(e.get("key") == gpu.SCHEDULE_LABEL for term in terms for e in expressions(term)):
        allowed: set[str] = set()
        for term in terms:
            term_modes = _ALL_MODES
            for expression in expressions(term):
                if expression.get("key") == gpu.SCHEDULE_LABEL:
                    term_modes = term_modes & _modes_of_expression(expression)
            allowed |= term_modes
        constraints.append(
            ModeConstraint(
                allowed=frozenset(allowed),
                source=f"required node affinity on {gpu.SCHEDULE_LABEL}",
            )
        )
    if not constraints:
        return None
    allowed_all = frozenset(_ALL_MODES)
    for constraint in constraints:
        allowed_all &= constraint.allowed
    return ModeConstraint(allowed=allowed_all, source=" and ".join(constraint.source for constraint in constraints))


def expression(key: str, operator: str, values: Sequence[str] = ()) -> dict[str, Any]:
    """A nodeSelectorRequirement; `values` only for the operators that take them."""
    built: dict[str, Any] = {"key": key, "operator": operator}
    if operator not in ("Exists", "DoesNotExist"):
        built["values"] = list(values)
    return built


def _same(first: Mapping[str, Any], second: Mapping[str, Any]) -> bool:
    return (
        first.get("key") == second.get("key")
        and first.get("operator") == second.get("operator")
        and _values(first) == _values(second)
    )


def require(spec: Mapping[str, Any], *, spec_path: str, requirements: Sequence[Mapping[str, Any]]) -> list[patching.Operation]:
    """`add` operations that make every requirement hold in the pod's required node affinity.

    Each requirement goes into every existing nodeSelectorTerm that lacks it (terms are ORed), or
    into a new term where there is none. Nothing is removed or rewritten, so the user's own
    constraints still hold. Malformed structure (a string where a mapping belongs) is left alone:
    the apiserver refuses such a pod anyway.
    """
    if not requirements:
        return []
    new_term = {"matchExpressions": [dict(r) for r in requirements]}
    affinity = spec.get("affinity")
    if affinity is None:
        return [
            patching.add(
                patching.join(spec_path, "affinity"),
                {"nodeAffinity": {_REQUIRED: {"nodeSelectorTerms": [new_term]}}},
            )
        ]
    if not isinstance(affinity, Mapping):
        return []
    affinity_path = patching.join(spec_path, "affinity")
    node = affinity.get("nodeAffinity")
    if node is None:
        return [
            patching.add(
                patching.join(affinity_path, "nodeAffinity"),
                {_REQUIRED: {"nodeSelectorTerms": [new_term]}},
            )
        ]
    if not isinstance(node, Mapping):
        return []
    node_path = patching.join(affinity_path, "nodeAffinity")
    required = node.get(_REQUIRED)
    if required is None:
        return [patching.add(patching.join(node_path, _REQUIRED), {"nodeSelectorTerms": [new_term]})]
    if not isinstance(required, Mapping):
        return []
    terms_path = patching.join(node_path, _REQUIRED, "nodeSelectorTerms")
    terms = required.get("nodeSelectorTerms")
    if terms is None or (isinstance(terms, (list, tuple)) and not terms):
        return [patching.add(terms_path, [new_term])]
    if not isinstance(terms, (list, tuple)):
        return []
    operations: list[patching.Operation] = []
    for index, term in enumerate(terms):
        if not isinstance(term, Mapping):
            continue
        term_path = patching.join(terms_path, str(index))
        present = term.get("matchExpressions")
        if present is None:
            operations.append(patching.add(patching.join(term_path, "matchExpressions"), [dict(r) for r in requirements]))
            continue
        if not isinstance(present, (list, tuple)):
            continue
        existing = [e for e in present if isinstance(e, Mapping)]
        for requirement in requirements:
            if not any(_same(requirement, e) for e in existing):
                operations.append(patching.add(patching.join(term_path, "matchExpressions", "-"), dict(requirement)))
    return operations
