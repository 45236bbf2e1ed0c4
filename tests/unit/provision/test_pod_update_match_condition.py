"""deploy/webhook-configurations.yaml: the validating webhook gets a pod's own UPDATE only when an
allocation annotation differs (GPU008), a device annotation is added or changed (GPU010) or the
budget gate is removed (GPU013), evaluated with the CEL runtime the user policies use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from policies import cel, gpu
from policies.gpu import budgets

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
CONDITION = "pod-update-changes-guarded-annotations"


def validating_hook() -> dict[str, Any]:
    documents = [d for d in yaml.safe_load_all((DEPLOY / "webhook-configurations.yaml").read_text()) if d]
    [configuration] = [d for d in documents if d["kind"] == "ValidatingWebhookConfiguration"]
    [hook] = [h for h in configuration["webhooks"] if h["name"] == "validate.gpu-admission.io"]
    found: dict[str, Any] = hook
    return found


@pytest.fixture(scope="module")
def condition() -> cel.Expression:
    [expression] = [c["expression"] for c in validating_hook()["matchConditions"] if c["name"] == CONDITION]
    return cel.compile_expression(cel.environment(), expression, field=CONDITION)


def pod(annotations: dict[str, str] | None, **labels: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p", "namespace": "team-a"}
    if annotations is not None:
        metadata["annotations"] = annotations
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"containers": [{"name": "m"}]}}


def request(operation: str = "UPDATE", *, resource: str = "pods", subresource: str | None = None) -> dict[str, Any]:
    # kube-apiserver leaves subResource out of a request without one (omitempty), so both shapes occur.
    found: dict[str, Any] = {"operation": operation, "resource": {"group": "", "version": "v1", "resource": resource}}
    if subresource is not None:
        found["subResource"] = subresource
    return found


def sent(condition: cel.Expression, *, req: dict[str, Any], new: Any, old: Any) -> bool:
    result = cel.evaluate(condition, {"request": req, "object": new, "oldObject": old})
    assert isinstance(result, bool)
    return result


BOUND = {"ALIYUN_COM_GPU_MEM_IDX": "1", "ALIYUN_COM_GPU_MEM_POD": "4", "gpu-admission.io/allocation": "{}", "team": "ml"}


@pytest.mark.parametrize("subresource", [None, ""])
@pytest.mark.parametrize(
    ("old", "new"),
    [
        (pod(None), pod(None, team="b")),  # no annotations on either side
        (pod({}), pod(None)),
        (pod(BOUND), pod(BOUND, team="b")),  # a label edit of a bound pod
        (pod(BOUND), pod({**BOUND, "note": "x"})),  # another annotation
        (pod({"note": "x"}), pod({"note": "y"})),
        (pod({"aliyun_com_gpu_mem_idx": "0"}), pod({"aliyun_com_gpu_mem_idx": "1"})),  # a key nobody reads
    ],
    ids=["none", "empty-map", "label", "other-annotation", "other-value", "other-spelling"],
)
def test_ordinary_pod_updates_are_not_sent(
    condition: cel.Expression, old: dict[str, Any], new: dict[str, Any], subresource: str | None
) -> None:
    assert sent(condition, req=request(subresource=subresource), new=new, old=old) is False


@pytest.mark.parametrize("key", gpu.ALLOCATION_ANNOTATIONS)
@pytest.mark.parametrize("subresource", [None, ""])
def test_an_update_that_adds_changes_or_removes_a_key_is_sent(
    condition: cel.Expression, key: str, subresource: str | None
) -> None:
    req = request(subresource=subresource)
    assert sent(condition, req=req, new=pod({key: "0"}), old=pod(None))  # added, old has no map
    assert sent(condition, req=req, new=pod({key: "0"}), old=pod({"team": "ml"}))  # added beside others
    assert sent(condition, req=req, new=pod({key: "1"}), old=pod({key: "0"}))  # changed
    assert sent(condition, req=req, new=pod(None), old=pod({key: "0"}))  # removed with the whole map
    assert sent(condition, req=req, new=pod({"team": "ml"}), old=pod({key: "0", "team": "ml"}))  # removed
    assert not sent(condition, req=req, new=pod({key: "0"}, x="y"), old=pod({key: "0"}))  # unchanged


@pytest.mark.parametrize(
    ("req", "old"),
    [
        (request("CREATE"), None),  # oldObject is null on CREATE
        (request("UPDATE", subresource="ephemeralcontainers"), pod(None)),
        (request("UPDATE", resource="deployments"), {"kind": "Deployment", "metadata": {"name": "d"}}),
        (request("CREATE", resource="jobs"), None),
    ],
    ids=["pod-create", "ephemeral-containers", "deployment-update", "job-create"],
)
def test_everything_else_the_rules_match_is_still_sent(
    condition: cel.Expression, req: dict[str, Any], old: dict[str, Any] | None
) -> None:
    assert sent(condition, req=req, new=pod(None), old=old)


def test_the_keys_in_the_expression_are_the_gpu_models() -> None:
    [expression] = [c["expression"] for c in validating_hook()["matchConditions"] if c["name"] == CONDITION]
    listed = expression.split("[", 1)[1].split("]", 1)[0]
    assert [key.strip().strip("'") for key in listed.split(",")] == list(gpu.ALLOCATION_ANNOTATIONS)


def test_pod_updates_are_validated_but_never_mutated_and_the_mirror_pod_condition_stays() -> None:
    hook = validating_hook()
    rules = {(tuple(r["operations"]), tuple(r["resources"])) for r in hook["rules"]}
    assert (("UPDATE",), ("pods",)) in rules and (("CREATE",), ("pods",)) in rules
    assert not any("pods/binding" in r["resources"] or "pods/status" in r["resources"] for r in hook["rules"])
    assert [c["name"] for c in hook["matchConditions"]][:2] == ["not-a-mirror-pod", CONDITION]
    documents = [d for d in yaml.safe_load_all((DEPLOY / "webhook-configurations.yaml").read_text()) if d]
    [mutating] = [d for d in documents if d["kind"] == "MutatingWebhookConfiguration"]
    mutating_rules = {(tuple(r["operations"]), tuple(r["resources"])) for r in mutating["webhooks"][0]["rules"]}
    assert (("UPDATE",), ("pods",)) not in mutating_rules


# --- GPU010: device-injection annotations -----------------------------------------------------------

DEVICE_KEYS = [
    "cdi.k8s.io/gpu",
    "nvidia.cdi.k8s.io/container.main",
    "nvidia.cdi.k8s.io/pod",
    "nvidia.cdi.k8s.io",
    "cdi-devices.noderesource.dev/container.main",
    "cdi-devices.nri.io",
    "devices.noderesource.dev/pod",
    "devices.nri.io/container.c",
    "mounts.noderesource.dev/pod",
    "mounts.nri.io",
]


@pytest.mark.parametrize("key", DEVICE_KEYS)
@pytest.mark.parametrize("subresource", [None, ""])
def test_an_update_that_adds_or_changes_a_device_annotation_is_sent(
    condition: cel.Expression, key: str, subresource: str | None
) -> None:
    req = request(subresource=subresource)
    assert gpu.is_device_annotation(key)
    assert sent(condition, req=req, new=pod({key: "nvidia.com/gpu=all"}), old=pod(None))  # added, old has no map
    assert sent(condition, req=req, new=pod({key: "nvidia.com/gpu=all", "team": "ml"}), old=pod({"team": "ml"}))
    assert sent(condition, req=req, new=pod({key: "nvidia.com/gpu=all"}), old=pod({key: "nvidia.com/gpu=0"}))  # changed


@pytest.mark.parametrize("key", DEVICE_KEYS)
def test_a_device_annotation_kept_or_removed_is_not_sent(condition: cel.Expression, key: str) -> None:
    # GPU010 lets a pod that already carries one (admitted before it) take other edits and drop it.
    req = request()
    assert not sent(condition, req=req, new=pod({key: "nvidia.com/gpu=0"}, x="y"), old=pod({key: "nvidia.com/gpu=0"}))
    assert not sent(condition, req=req, new=pod({"team": "ml"}), old=pod({key: "nvidia.com/gpu=0", "team": "ml"}))
    assert not sent(condition, req=req, new=pod(None), old=pod({key: "nvidia.com/gpu=0"}))


@pytest.mark.parametrize(
    "key", ["CDI.K8S.IO/gpu", "cdi.k8s.io.gpu", "xcdi.k8s.io/gpu", "example.com/cdi.k8s.io", "nvidia.com/gpu"]
)
def test_keys_no_reader_acts_on_are_not_sent(condition: cel.Expression, key: str) -> None:
    assert not gpu.is_device_annotation(key)
    assert not sent(condition, req=request(), new=pod({key: "nvidia.com/gpu=all"}), old=pod(None))


def test_the_device_domains_in_the_expression_are_the_gpu_models() -> None:
    [expression] = [c["expression"] for c in validating_hook()["matchConditions"] if c["name"] == CONDITION]
    listed = expression.split("object.metadata.annotations.exists(k,", 1)[1].split("[", 1)[1].split("]", 1)[0]
    assert [key.strip().strip("'") for key in listed.split(",")] == list(gpu.DEVICE_ANNOTATION_DOMAINS)


@pytest.mark.parametrize("key", gpu.CRIO_DEVICES_ANNOTATIONS)
def test_an_update_that_adds_or_changes_crios_devices_annotation_is_sent(condition: cel.Expression, key: str) -> None:
    req = request()
    assert sent(condition, req=req, new=pod({key: "/dev/nvidia0"}), old=pod(None))
    assert sent(condition, req=req, new=pod({key: "/dev/fuse,/dev/nvidia0"}), old=pod({key: "/dev/fuse"}))
    assert not sent(condition, req=req, new=pod({key: "/dev/fuse"}, x="y"), old=pod({key: "/dev/fuse"}))
    assert not sent(condition, req=req, new=pod(None), old=pod({key: "/dev/fuse"}))


def test_crios_devices_keys_in_the_expression_are_the_gpu_models() -> None:
    [expression] = [c["expression"] for c in validating_hook()["matchConditions"] if c["name"] == CONDITION]
    tail = expression.split("oldObject.metadata.annotations[k] == object.metadata.annotations[k]))) ||", 1)[1]
    listed = tail.split("[", 1)[1].split("]", 1)[0]
    assert [key.strip().strip("'") for key in listed.split(",")] == list(gpu.CRIO_DEVICES_ANNOTATIONS)


# --- GPU013: the budget scheduling gate -------------------------------------------------------------------

BUDGET_GATE = {"name": budgets.GATE}
OTHER_GATE = {"name": "example.com/other"}


def gated(*gates: dict[str, str] | None) -> dict[str, Any]:
    """A pod whose spec.schedulingGates is `gates` (no field at all for a single None)."""
    found = pod(None)
    if gates != (None,):
        found["spec"]["schedulingGates"] = [dict(g) for g in gates if g is not None]
    return found


@pytest.mark.parametrize(
    "new",
    [gated(None), gated(), gated(OTHER_GATE), gated(OTHER_GATE, {"name": "gpu-admission.io/Budget"})],
    ids=["field-gone", "emptied", "other-left", "other-spelling-left"],
)
@pytest.mark.parametrize("subresource", [None, ""])
def test_an_update_that_removes_the_budget_gate_is_sent(
    condition: cel.Expression, new: dict[str, Any], subresource: str | None
) -> None:
    assert sent(condition, req=request(subresource=subresource), new=new, old=gated(OTHER_GATE, BUDGET_GATE))
    assert sent(condition, req=request(subresource=subresource), new=new, old=gated(BUDGET_GATE))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (gated(BUDGET_GATE), gated(BUDGET_GATE)),  # kept (a label edit, say)
        (gated(OTHER_GATE, BUDGET_GATE), gated(BUDGET_GATE)),  # another gate lifted
        (gated(OTHER_GATE), gated(None)),  # a pod without ours
        (gated(None), gated(None)),
        (gated({"note": "no name"}), gated(None)),  # a gate without a name cannot fail the condition
    ],
    ids=["kept", "other-lifted", "never-gated", "no-gates", "nameless"],
)
def test_updates_that_keep_the_budget_gate_or_never_had_it_are_not_sent(
    condition: cel.Expression, old: dict[str, Any], new: dict[str, Any]
) -> None:
    assert not sent(condition, req=request(), new=new, old=old)


def test_the_gate_in_the_expression_is_the_gpu_models() -> None:
    [expression] = [c["expression"] for c in validating_hook()["matchConditions"] if c["name"] == CONDITION]
    assert expression.count(f"g.name == '{budgets.GATE}'") == 2
