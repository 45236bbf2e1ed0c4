"""deploy/node-guard.yaml: the key lists in its CEL agree with what the labeler and the extender write,
and its policies, evaluated here with the CEL runtime the user policies use, let exactly those writes
through and refuse the rest.

The evaluation below follows ValidatingAdmissionPolicy's order (matchConditions, then variables in
order, then every validation); the real kube-apiserver runs the same documents in
tests/e2e/test_node_guard.py.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from cel_expr_python import cel  # type: ignore[import-untyped]  # stubs without py.typed
from cel_expr_python.ext import ext_optional, ext_strings  # type: ignore[import-untyped]

from policies import gpu
from policies.gpu import allocation as allocation_  # `allocation` names a pod's allocation here
from policies.gpu import usage
from webhook.labeler import inventory, labels, ownership

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
LABELER = "gpu-admission-labeler-node-guard"
EXTENDER = "gpu-admission-extender-node-guard"
NODE_CLAIM = "authentication.kubernetes.io/node-name"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture(scope="module")
def guard() -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in documents(DEPLOY / "node-guard.yaml")}


def policy(guard: dict[tuple[str, str], dict[str, Any]], name: str) -> dict[str, Any]:
    return guard[("ValidatingAdmissionPolicy", name)]


def literal_list(spec: Mapping[str, Any], variable: str) -> list[str]:
    """A variable whose expression is a list of string literals (CEL and Python spell it alike)."""
    [expression] = [v["expression"] for v in spec["variables"] if v["name"] == variable]
    value = ast.literal_eval(expression)
    assert isinstance(value, list) and all(isinstance(item, str) for item in value), expression
    return value


def service_account_user(path: Path) -> str:
    [account] = [d for d in documents(path) if d["kind"] == "ServiceAccount"]
    return f"system:serviceaccount:{account['metadata']['namespace']}:{account['metadata']['name']}"


# --- the CEL runtime, as ValidatingAdmissionPolicy runs it -------------------------------------------


@dataclasses.dataclass(frozen=True)
class Verdict:
    matched: bool
    denials: tuple[str, ...]

    @property
    def allowed(self) -> bool:
        return not self.denials


class Policy:
    """One ValidatingAdmissionPolicy compiled: every expression once, evaluated like the apiserver."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        self._env = cel.NewEnv(
            variables={name: cel.Type.DYN for name in ("object", "oldObject", "request", "variables")},
            extensions=[ext_strings.ExtStrings(), ext_optional.ExtOptional()],
        )
        self._conditions = [self._env.compile(c["expression"]) for c in spec.get("matchConditions", [])]
        self._variables = [(v["name"], self._env.compile(v["expression"])) for v in spec.get("variables", [])]
        self._validations = [
            (
                self._env.compile(v["expression"]),
                self._env.compile(v["messageExpression"]) if "messageExpression" in v else None,
                v.get("message", ""),
            )
            for v in spec["validations"]
        ]

    @staticmethod
    def _value(program: Any, data: Mapping[str, Any]) -> Any:
        value = program.eval(data=dict(data))
        assert value.type() != cel.Type.ERROR, value.value()
        return value.plain_value()

    def review(self, *, request: Mapping[str, Any], obj: Any, old: Any) -> Verdict:
        data: dict[str, Any] = {"request": request, "object": obj, "oldObject": old, "variables": {}}
        if not all(self._value(condition, data) is True for condition in self._conditions):
            return Verdict(matched=False, denials=())
        for name, program in self._variables:
            data["variables"] = {**data["variables"], name: self._value(program, data)}
        denials = []
        for check, message_program, message in self._validations:
            result = self._value(check, data)
            assert isinstance(result, bool)
            if not result:
                denials.append(self._value(message_program, data) if message_program is not None else message)
        return Verdict(matched=True, denials=tuple(denials))


@pytest.fixture(scope="module")
def labeler_policy(guard: dict[tuple[str, str], dict[str, Any]]) -> Policy:
    return Policy(policy(guard, LABELER)["spec"])


@pytest.fixture(scope="module")
def extender_policy(guard: dict[tuple[str, str], dict[str, Any]]) -> Policy:
    return Policy(policy(guard, EXTENDER)["spec"])


LABELER_USER = service_account_user(DEPLOY / "labeler.yaml")
EXTENDER_USER = service_account_user(DEPLOY / "extender.yaml")


def request(
    *,
    user: str,
    name: str = "node-a",
    operation: str = "UPDATE",
    subresource: str = "",
    claim: str | None = "node-a",
    resource: str = "nodes",
) -> dict[str, Any]:
    """An AdmissionRequest as CEL sees it: empty fields left out, as in the apiserver's JSON."""
    user_info: dict[str, Any] = {"username": user, "groups": ["system:serviceaccounts", "system:authenticated"]}
    if claim is not None:
        user_info["extra"] = {NODE_CLAIM: [claim], "authentication.kubernetes.io/pod-name": ["labeler-x"]}
    built: dict[str, Any] = {
        "operation": operation,
        "name": name,
        "userInfo": user_info,
        "resource": {"group": "", "version": "v1", "resource": resource},
    }
    if subresource:
        built["subResource"] = subresource
    return built


def node(name: str = "node-a") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": "0f6d",
            "resourceVersion": "41",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": "z1", gpu.SCHEDULE_LABEL: "cgpu"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": "10.244.1.0/24", "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
            "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
            "nodeInfo": {"kubeletVersion": "v1.34.4"},
        },
    }


def merged(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 JSON merge patch, as the apiserver applies the labeler's and the extender's patches."""
    result = copy.deepcopy(dict(base))
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = merged(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


INVENTORY = inventory.make(
    [
        inventory.Card(index=0, uuid="GPU-0", name="Tesla T4", memory_mib=15360),
        inventory.Card(index=1, uuid="GPU-1", name="NVIDIA A10", memory_mib=23028),
    ],
    driver_version="550.107.02",
    cuda_version="12.4",
    links=[inventory.link(0, 1, "PHB")],
)


# --- the literals agree with the code that writes ----------------------------------------------------


def test_the_labeler_policy_lists_exactly_the_labels_annotations_and_resources_the_labeler_writes(
    guard: dict[tuple[str, str], dict[str, Any]],
) -> None:
    spec = policy(guard, LABELER)["spec"]
    own_labels = set(literal_list(spec, "ownLabels"))
    own_annotations = set(literal_list(spec, "ownAnnotations"))
    assert own_labels == {
        gpu.CARD_NAME_LABEL,
        gpu.CARD_MEMORY_LABEL,
        gpu.CARD_COUNT_LABEL,
        gpu.CARD_MEMORY_MIB_LABEL,
        labels.DRIVER_VERSION_LABEL,
        labels.CUDA_VERSION_LABEL,
    }
    assert own_annotations == {
        gpu.INVENTORY_ANNOTATION,
        gpu.TOPOLOGY_ANNOTATION,
        labels.MIXED_ANNOTATION,
        ownership.OWNED_ANNOTATION,
        usage.USAGE_ANNOTATION,
    }
    # And by behaviour: a node with everything (mixed cards, versions, links) gets nothing outside them.
    desired = labels.compute(INVENTORY)
    assert set(desired.labels) == own_labels
    assert set(desired.annotations) | {ownership.OWNED_ANNOTATION, usage.USAGE_ANNOTATION} == own_annotations
    assert ownership.ACCELERATOR_LABELS <= own_labels, "--take-over and stale removal touch the whole group"
    assert set(literal_list(spec, "gpuResources")) == set(gpu.Resource)
    for mode in gpu.Mode:
        assert set(labels.capacity(INVENTORY, mode=mode)) <= set(gpu.Resource), mode


def test_the_extender_policy_lists_exactly_the_stamp_and_the_annotations_bind_writes(
    guard: dict[tuple[str, str], dict[str, Any]],
) -> None:
    spec = policy(guard, EXTENDER)["spec"]
    assert literal_list(spec, "nodeAnnotations") == [gpu.LEDGER_FREED_ANNOTATION]
    shared = allocation_.Allocation(uid="u", namespace="n", name="p", node="node-a", cards=(0,), memory_gib=4)
    whole = allocation_.Allocation(uid="u", namespace="n", name="p", node="node-a", cards=(0, 1), whole=True)
    written = set(allocation_.bind_annotations(shared, card_memory_gib=15)) | set(
        allocation_.bind_annotations(whole, card_memory_gib=15)
    )
    assert set(literal_list(spec, "bindingAnnotations")) == written


def test_each_policy_matches_only_its_service_account_from_deploy(guard: dict[tuple[str, str], dict[str, Any]]) -> None:
    for name, user in ((LABELER, LABELER_USER), (EXTENDER, EXTENDER_USER)):
        [condition] = policy(guard, name)["spec"]["matchConditions"]
        assert condition["expression"] == f"request.userInfo.username == '{user}'"
        binding = guard[("ValidatingAdmissionPolicyBinding", name)]["spec"]
        assert binding == {"policyName": name, "validationActions": ["Deny"]}
        assert policy(guard, name)["spec"]["failurePolicy"] == "Fail"


def test_the_base_installs_the_node_guard() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert "node-guard.yaml" in kustomization["resources"]


def test_the_labeler_rbac_writes_nothing_but_nodes_and_their_status() -> None:
    [role] = [d for d in documents(DEPLOY / "labeler.yaml") if d["kind"] == "ClusterRole"]
    verbs = {resource: set(rule["verbs"]) for rule in role["rules"] for resource in rule["resources"]}
    assert verbs["nodes"] == {"get", "patch"} and verbs["nodes/status"] == {"patch"}
    writes = {
        resource: granted - {"get", "list", "watch"} for resource, granted in verbs.items() if not resource.startswith("nodes")
    }
    assert not any(writes.values()), writes


def test_the_extender_rbac_patches_nodes_for_its_stamp_and_writes_no_pod() -> None:
    """The ledger left the Node for a Lease per node; the one Node write left is the ledger-freed
    stamp (`nudge`), which the node guard narrows to that key. The preempt verb only lists
    PodDisruptionBudgets (issue 27): kube-scheduler evicts, never the extender. It lists and watches
    Namespaces for their labels only (issue 36: a GPU budget may select namespaces by label)."""
    [role] = [d for d in documents(DEPLOY / "extender.yaml") if d["kind"] == "ClusterRole"]
    verbs = {resource: sorted(rule["verbs"]) for rule in role["rules"] for resource in rule["resources"]}
    assert verbs == {
        "nodes": ["get", "list", "patch", "watch"],
        "pods": ["get", "list", "watch"],
        "pods/binding": ["create"],
        "poddisruptionbudgets": ["list"],
        "namespaces": ["list", "watch"],
        # DRA (docs/dra.md): read slices and claims; the leader's DeviceTaintRules, nothing else written
        "resourceslices": ["list", "watch"],
        "resourceclaims": ["list", "watch"],
        "devicetaintrules": ["create", "delete", "list"],
    }


# --- the labeler: its own writes pass ----------------------------------------------------------------


def test_the_labelers_real_label_patch_of_its_own_node_passes(labeler_policy: Policy) -> None:
    before = node()
    plan = ownership.plan(ownership.Node.from_object(before), desired=labels.compute(INVENTORY))
    assert plan.patch is not None
    after = merged(before, plan.patch)
    verdict = labeler_policy.review(request=request(user=LABELER_USER), obj=after, old=before)
    assert verdict.matched and verdict.allowed, verdict.denials


def test_the_labelers_stale_removal_and_take_over_pass(labeler_policy: Policy) -> None:
    labelled = merged(node(), ownership.plan(ownership.Node.from_object(node()), desired=labels.compute(INVENTORY)).patch or {})
    # The cards went away: every owned key is removed (JSON merge patch null).
    removal = ownership.plan(ownership.Node.from_object(labelled), desired=labels.compute(inventory.make([])))
    assert removal.patch is not None and None in removal.patch["metadata"]["labels"].values()
    verdict = labeler_policy.review(request=request(user=LABELER_USER), obj=merged(labelled, removal.patch), old=labelled)
    assert verdict.allowed, verdict.denials
    # Another component's aliyun.accelerator labels, taken over with --take-over.
    foreign = node()
    foreign["metadata"]["labels"].update(
        {gpu.CARD_NAME_LABEL: "Tesla-P4", gpu.CARD_COUNT_LABEL: "1", gpu.CARD_MEMORY_LABEL: "7611MiB"}
    )
    taken = ownership.plan(ownership.Node.from_object(foreign), desired=labels.compute(INVENTORY), take_over=True)
    verdict = labeler_policy.review(request=request(user=LABELER_USER), obj=merged(foreign, taken.patch or {}), old=foreign)
    assert verdict.allowed, verdict.denials


def test_the_labelers_real_capacity_patch_passes_on_node_status(labeler_policy: Policy) -> None:
    before = node()
    patch = ownership.capacity_patch(ownership.Node.from_object(before), want=labels.capacity(INVENTORY, mode=gpu.Mode.CGPU))
    assert patch is not None and str(gpu.Resource.GPU_MEM) in patch["status"]["capacity"]
    verdict = labeler_policy.review(
        request=request(user=LABELER_USER, subresource="status"), obj=merged(before, patch), old=before
    )
    assert verdict.allowed, verdict.denials


def test_an_update_that_changes_nothing_passes(labeler_policy: Policy) -> None:
    assert labeler_policy.review(request=request(user=LABELER_USER), obj=node(), old=node()).allowed


def test_other_users_are_not_matched(labeler_policy: Policy, extender_policy: Policy) -> None:
    before = node()
    after = merged(before, {"spec": {"unschedulable": True}, "metadata": {"labels": {gpu.SCHEDULE_LABEL: "share"}}})
    for user in ("kubernetes-admin", "system:node:node-a", "system:serviceaccount:tenant:gpu-admission-labeler"):
        assert not labeler_policy.review(request=request(user=user), obj=after, old=before).matched
        assert not extender_policy.review(request=request(user=user), obj=after, old=before).matched


# --- the labeler: everything else is refused ---------------------------------------------------------


def denied(policy: Policy, *, obj: Any, old: Any, **fields: Any) -> str:
    verdict = policy.review(request=request(**fields), obj=obj, old=old)
    assert verdict.matched and not verdict.allowed, "expected a refusal"
    message = " | ".join(verdict.denials)
    assert message.startswith("gpu-admission node guard: "), message
    return message


def test_another_nodes_gpu_labels_are_refused(labeler_policy: Policy) -> None:
    before = node("node-b")
    after = merged(before, {"metadata": {"labels": {gpu.CARD_COUNT_LABEL: "8"}}})
    message = denied(labeler_policy, obj=after, old=before, user=LABELER_USER, name="node-b", claim="node-a")
    assert message == "gpu-admission node guard: the labeler running on node node-a may not change node node-b"


@pytest.mark.parametrize("extra", [None, {}, {"authentication.kubernetes.io/pod-name": ["x"]}, {NODE_CLAIM: []}])
def test_a_token_without_a_node_claim_is_refused_everything(labeler_policy: Policy, extra: dict[str, Any] | None) -> None:
    before = node()
    after = merged(before, {"metadata": {"labels": {gpu.CARD_COUNT_LABEL: "2"}}})
    built = request(user=LABELER_USER, claim=None)
    if extra is not None:
        built["userInfo"]["extra"] = extra
    verdict = labeler_policy.review(request=built, obj=after, old=before)
    assert verdict.denials and "carries no node claim" in verdict.denials[0], verdict.denials


@pytest.mark.parametrize(
    ("patch", "refused"),
    [
        ({"metadata": {"labels": {gpu.SCHEDULE_LABEL: "share"}}}, gpu.SCHEDULE_LABEL),
        ({"metadata": {"labels": {gpu.SCHEDULE_LABEL: None}}}, gpu.SCHEDULE_LABEL),
        ({"metadata": {"labels": {gpu.PLACEMENT_LABEL: "spread"}}}, gpu.PLACEMENT_LABEL),
        ({"metadata": {"labels": {"topology.kubernetes.io/zone": "z2"}}}, "topology.kubernetes.io/zone"),
        ({"metadata": {"labels": {"gpu-admission.io/anything-else": "x"}}}, "gpu-admission.io/anything-else"),
        ({"metadata": {"labels": {"aliyun.accelerator/other": "x"}}}, "aliyun.accelerator/other"),
        ({"metadata": {"annotations": {gpu.RESERVATIONS_ANNOTATION: "{}"}}}, gpu.RESERVATIONS_ANNOTATION),
        ({"metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": None}}}, "node.alpha.kubernetes.io/ttl"),
        ({"spec": {"taints": None}}, "spec"),
        ({"spec": {"unschedulable": True}}, "spec"),
        ({"metadata": {"finalizers": ["x/y"]}}, "finalizers"),
        ({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "x", "uid": "1"}]}}, "ownerReferences"),
    ],
)
def test_anything_but_its_own_keys_on_its_own_node_is_refused(
    labeler_policy: Policy, patch: dict[str, Any], refused: str
) -> None:
    before = node()
    # Mixed in with a legitimate change, so that the refusal is not an all-or-nothing accident.
    after = merged(merged(before, {"metadata": {"labels": {gpu.CARD_COUNT_LABEL: "2"}}}), patch)
    assert refused in denied(labeler_policy, obj=after, old=before, user=LABELER_USER)


@pytest.mark.parametrize(
    ("patch", "refused"),
    [
        ({"status": {"capacity": {"cpu": "64"}}}, "cpu"),
        ({"status": {"allocatable": {"memory": None}}}, "memory"),
        ({"status": {"capacity": {"example.com/fpga": "1"}}}, "example.com/fpga"),
        ({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}, "conditions"),
        ({"status": {"nodeInfo": None}}, "nodeInfo"),
        ({"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.9"}]}}, "addresses"),
    ],
)
def test_status_beyond_the_gpu_capacity_is_refused(labeler_policy: Policy, patch: dict[str, Any], refused: str) -> None:
    before = node()
    after = merged(merged(before, {"status": {"capacity": {str(gpu.Resource.GPU_MEM): "30"}}}), patch)
    assert refused in denied(labeler_policy, obj=after, old=before, user=LABELER_USER, subresource="status")


def test_creating_or_deleting_a_node_is_refused(labeler_policy: Policy) -> None:
    assert "not create Nodes" in denied(labeler_policy, obj=node(), old=None, user=LABELER_USER, operation="CREATE")
    assert "not delete Nodes" in denied(labeler_policy, obj=None, old=node(), user=LABELER_USER, operation="DELETE")


# --- the extender ------------------------------------------------------------------------------------


def test_the_extenders_stamp_passes_and_nothing_else_on_a_node(extender_policy: Policy) -> None:
    before = node()
    stamp = {gpu.LEDGER_FREED_ANNOTATION: "2026-11-26T18:00:00.000Z"}
    after = merged(before, {"metadata": {"annotations": stamp}})
    assert extender_policy.review(request=request(user=EXTENDER_USER, claim=None), obj=after, old=before).allowed
    restamped = merged(after, {"metadata": {"annotations": {gpu.LEDGER_FREED_ANNOTATION: "2026-11-26T18:00:01.000Z"}}})
    assert extender_policy.review(request=request(user=EXTENDER_USER, claim=None), obj=restamped, old=after).allowed
    # An earlier version's ledger write (an old replica beside a new one during an upgrade) is refused:
    # the two must never commit to different objects at once.
    ledger = {gpu.RESERVATIONS_ANNOTATION: '{"u1":{"cards":[0]}}'}
    old_commit = merged(before, {"metadata": {"resourceVersion": "41", "annotations": ledger}})
    assert gpu.RESERVATIONS_ANNOTATION in denied(extender_policy, obj=old_commit, old=before, user=EXTENDER_USER, claim=None)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"metadata": {"labels": {gpu.CARD_COUNT_LABEL: "8"}}}, gpu.CARD_COUNT_LABEL),
        ({"metadata": {"labels": {gpu.SCHEDULE_LABEL: "share"}}}, gpu.SCHEDULE_LABEL),
        ({"metadata": {"annotations": {gpu.INVENTORY_ANNOTATION: "[]"}}}, gpu.INVENTORY_ANNOTATION),
        ({"spec": {"unschedulable": True}}, "spec or status"),
        ({"metadata": {"finalizers": ["x/y"]}}, "finalizers"),
    ]
    for patch, refused in cases:
        message = denied(extender_policy, obj=merged(after, patch), old=before, user=EXTENDER_USER, claim=None)
        assert refused in message, (patch, message)
    status = merged(before, {"status": {"capacity": {str(gpu.Resource.GPU_MEM): "300"}}})
    assert "spec or status" in denied(
        extender_policy, obj=status, old=before, user=EXTENDER_USER, claim=None, subresource="status"
    )
    assert "not create nodes" in denied(extender_policy, obj=node(), old=None, user=EXTENDER_USER, claim=None, operation="CREATE")


def binding(annotations: Mapping[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p", "namespace": "team", "uid": "u", "annotations": dict(annotations)},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "node-a"},
    }


def test_the_extenders_binding_may_carry_only_the_allocation_annotations(extender_policy: Policy) -> None:
    def review(obj: dict[str, Any]) -> Verdict:
        return extender_policy.review(
            request=request(user=EXTENDER_USER, claim=None, operation="CREATE", resource="pods", subresource="binding", name="p"),
            obj=obj,
            old=None,
        )

    allocation = allocation_.Allocation(
        uid="u", namespace="team", name="p", node="node-a", cards=(1,), memory_gib=4, assumed_at=1.0
    )
    written = allocation_.bind_annotations(allocation, card_memory_gib=15)
    assert review(binding(written)).allowed
    no_annotations = binding({})
    del no_annotations["metadata"]["annotations"]
    assert review(no_annotations).allowed
    forged = review(binding({**written, "gpu-admission.io/gpu-model": "A100", "CGPU_DISABLE": "true"}))
    [message] = forged.denials
    refused = message.rsplit("), not ", 1)[1]
    assert set(refused.split(", ")) == {"gpu-admission.io/gpu-model", "CGPU_DISABLE"}, message


def test_the_extenders_messages_name_what_it_may_change(extender_policy: Policy) -> None:
    before = node()
    after = merged(before, {"metadata": {"annotations": {"example.com/x": "1"}}})
    message = denied(extender_policy, obj=after, old=before, user=EXTENDER_USER, claim=None)
    assert message == (
        "gpu-admission node guard: the extender may change only its ledger-freed stamp "
        f"({gpu.LEDGER_FREED_ANNOTATION}) on Nodes, not example.com/x"
    )


def test_messages_name_the_refused_key_and_what_is_allowed(labeler_policy: Policy) -> None:
    before = node()
    after = merged(before, {"metadata": {"labels": {"topology.kubernetes.io/zone": "z9"}}})
    message = denied(labeler_policy, obj=after, old=before, user=LABELER_USER)
    assert message.startswith(
        "gpu-admission node guard: the labeler may change only its own labels (aliyun.accelerator/nvidia_name, "
    )
    assert message.endswith("), not topology.kubernetes.io/zone")
    assert json.dumps(message)  # a plain string the apiserver can carry
