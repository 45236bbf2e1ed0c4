"""The audit beside the extender's hold claims: a card the extender holds from DRA with a claim of
its own (in the ledger namespace) is no double booking (GPU216 passes), while the same claim in a
tenant's namespace is judged as any tenant's claim; and the audit lists the namespaces Kubernetes
allows DRA admin access in (label `resource.kubernetes.io/admin-access=true`)."""

from __future__ import annotations

from typing import Any

from policies import model
from policies import settings as settings_
from policies.gpu import dra, reservations
from tests.unit.audit.conftest import NodeFactory, PodFactory, allocation
from tests.unit.audit.test_audit_dra import SLICE, gpu_node, of, run
from webhook.audit import render, scan

DEVICE = dra.devices([SLICE])[("gpu.nvidia.com", "cgpu-0", "gpu-0")]


def hold(namespace: str) -> dict[str, Any]:
    claim = dra.hold_claim(DEVICE, namespace=namespace)
    return {
        **claim,
        "metadata": {**claim["metadata"], "uid": f"uid-{namespace}"},
        "status": {"allocation": dra.hold_allocation(DEVICE)},
    }


def test_the_extenders_hold_claim_is_no_double_booking(node: NodeFactory, pod: PodFactory) -> None:
    sharing = pod("sharing", gpu_mem=4, node_name="cgpu-0", annotations=allocation("cgpu-0", [0], mem=4))
    audit = run(gpu_node(node), sharing, SLICE, hold(reservations.LEDGER_NAMESPACE))
    assert of(audit, "GPU216") == []  # no DRA booking at all: the hold claim stands for the shared pods
    assert not [f for f in audit.findings if f.policy in ("GPU216", "GPU011") and f.result is model.Result.FAIL]


def test_the_same_claim_in_a_tenants_namespace_is_a_double_booking(node: NodeFactory, pod: PodFactory) -> None:
    sharing = pod("sharing", gpu_mem=4, node_name="cgpu-0", annotations=allocation("cgpu-0", [0], mem=4))
    (found,) = of(run(gpu_node(node), sharing, SLICE, hold("team-a")), "GPU216")
    assert found.result is model.Result.FAIL


def namespace(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def test_the_namespaces_labelled_for_admin_access_are_listed() -> None:
    objects = [
        namespace("gpu-ops", {dra.ADMIN_ACCESS_LABEL: "true"}),
        namespace("monitoring", {dra.ADMIN_ACCESS_LABEL: "true"}),
        namespace("team-a", {dra.ADMIN_ACCESS_LABEL: "false"}),  # the label, but not "true": no admin access
        namespace("team-b", {}),
    ]
    audit = run(*objects)
    assert audit.admin_access_namespaces == ("gpu-ops", "monitoring")
    line = "DRA admin access allowed (label resource.kubernetes.io/admin-access=true) in namespaces: gpu-ops, monitoring"
    assert line in render.table(audit)
    assert "gpu-ops, monitoring" in render.markdown(audit)
    # A namespaced audit lists only the namespaces it covers.
    scoped = scan.run(
        scan.Inventory.of(objects), settings=settings_.Settings(), scope=scan.Scope(namespaces=frozenset({"gpu-ops"})), now=0.0
    )
    assert scoped.admin_access_namespaces == ("gpu-ops",)


def test_without_such_namespaces_the_report_is_unchanged() -> None:
    audit = run(namespace("team-a", {}))
    assert audit.admin_access_namespaces == ()
    assert "admin access" not in render.table(audit)
