"""The audit and Dynamic Resource Allocation: GPU216 (a card held both by a DRA claim and by the
extender's pods), and GPU011 run on claims, claim templates and the pods that use them."""

from __future__ import annotations

import json
from typing import Any

from policies import model
from policies import settings as settings_
from tests import dra_objects
from tests.unit.audit.conftest import NOW, NodeFactory, PodFactory, allocation
from webhook.audit import findings, scan

CARDS = [{"index": i, "uuid": f"GPU-{i:04d}", "name": "Tesla-T4", "memoryMiB": 15360} for i in range(2)]
GRANTS = settings_.from_mapping({"dra": {"claims": [{"name": "ml", "namespaces": ["ml"], "classes": ["gpu.nvidia.com"]}]}})


def gpu_node(node: NodeFactory) -> dict[str, Any]:
    return node(
        "cgpu-0",
        capacity={"aliyun.com/gpu-mem": "30", "aliyun.com/gpu-count": "2"},
        annotations={"gpu-admission.io/gpu-inventory": json.dumps(CARDS)},
    )


SLICE = dra_objects.slice_for("cgpu-0", ["GPU-0000", "GPU-0001"])


def claim(device: str | None, *, namespace: str = "ml", name: str = "train", kind: str = "ResourceClaim") -> dict[str, Any]:
    return dra_objects.claim(
        name, namespace=namespace, kind=kind, uid=f"uid-{name}", allocated=None if device is None else ("cgpu-0", device)
    )


def run(*objects: dict[str, Any]) -> scan.Audit:
    return scan.run(scan.Inventory.of(objects), settings=GRANTS, now=NOW)


def of(audit: scan.Audit, policy: str) -> list[findings.Finding]:
    return [f for f in audit.findings if f.policy == policy]


def test_a_card_held_by_a_claim_and_by_shared_pods_is_double_booked(node: NodeFactory, pod: PodFactory) -> None:
    sharing = pod("sharing", gpu_mem=4, node_name="cgpu-0", annotations=allocation("cgpu-0", [0], mem=4))
    (found,) = of(run(gpu_node(node), sharing, SLICE, claim("gpu-0")), "GPU216")
    assert found.result is model.Result.FAIL and found.action is model.Action.ENFORCE
    assert "card 0 (GPU-0000) is allocated to ResourceClaim ml/train" in found.message and "team-a/sharing" in found.message
    assert [r.name for r in found.related] == ["train"]


def test_a_claim_on_the_other_card_passes(node: NodeFactory, pod: PodFactory) -> None:
    sharing = pod("sharing", gpu_mem=4, node_name="cgpu-0", annotations=allocation("cgpu-0", [0], mem=4))
    (found,) = of(run(gpu_node(node), sharing, SLICE, claim("gpu-1")), "GPU216")
    assert found.result is model.Result.PASS


def test_without_dra_there_is_no_gpu216_result(node: NodeFactory) -> None:
    assert of(run(gpu_node(node)), "GPU216") == []


def test_a_tenant_claim_and_template_of_a_gpu_class_fail_gpu011(node: NodeFactory) -> None:
    audit = run(
        gpu_node(node), claim(None, namespace="team-a"), claim(None, namespace="team-a", name="t", kind="ResourceClaimTemplate")
    )
    failed = {(f.subject.kind, f.subject.name) for f in of(audit, "GPU011") if f.result is model.Result.FAIL}
    assert failed == {("ResourceClaim", "train"), ("ResourceClaimTemplate", "t")}


def test_a_granted_namespace_claim_passes_gpu011(node: NodeFactory) -> None:
    (found,) = of(run(gpu_node(node), claim("gpu-1")), "GPU011")
    assert found.result is model.Result.PASS


def test_a_pod_using_a_tenant_claim_fails_gpu011_and_one_naming_a_missing_claim_passes(pod: PodFactory) -> None:
    using = pod("user", namespace="team-a")
    using["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "train"}]
    missing = pod("waiting", namespace="team-a")
    missing["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "later"}]
    audit = run(using, missing, claim(None, namespace="team-a"))
    results = {f.subject.name: f.result for f in of(audit, "GPU011") if f.subject.kind == "Pod"}
    assert results == {"user": model.Result.FAIL, "waiting": model.Result.PASS}
