"""GPU218 (namespaces over their GPU budget) and GPU219 (charges that cannot be computed), issue 36."""

from __future__ import annotations

from typing import Any

from policies import model, settings
from policies.gpu import budgets
from webhook.audit import findings, scan

NOW = 1_750_000_000.0
MIB = "gpu-admission.io/gpu-memory-mib"
BUDGET = {"gpuBudgets": [{"name": "team-a", "namespaces": ["team-a"], "memory": "32Gi"}]}


def node(name: str, *, card_mib: int | None = 16384) -> dict[str, Any]:
    labels = {"ack.node.gpu.schedule": "default", **({MIB: str(card_mib)} if card_mib else {})}
    capacity = {"nvidia.com/gpu": "8", "cpu": "64"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}, "status": {"capacity": capacity}}


def pod(
    name: str,
    *,
    namespace: str = "team-a",
    node_name: str | None = "gpu-0",
    limits: dict[str, Any] | None = None,
    phase: str = "Running",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "cuda:12", "resources": {"limits": limits or {"nvidia.com/gpu": 1}}}]
    }
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"},
        "spec": spec,
        "status": {"phase": phase},
    }


def namespace(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}


def run(*objects: dict[str, Any], config: dict[str, Any] | None = None, scope: scan.Scope = scan.Scope()) -> scan.Audit:
    return scan.run(
        scan.Inventory.of(objects), settings=settings.from_mapping(BUDGET if config is None else config), scope=scope, now=NOW
    )


def of(audit: scan.Audit, policy: str) -> dict[str, findings.Finding]:
    return {f"{f.subject.kind}/{f.subject.name}": f for f in audit.findings if f.policy == policy}


# --- GPU218 ------------------------------------------------------------------------------------------


def test_a_namespace_over_its_budget_fails_naming_budget_used_and_the_pods_charged() -> None:
    audit = run(node("gpu-0"), namespace("team-a"), pod("a"), pod("b"), pod("c", limits={"nvidia.com/mig-1g.10gb": 1}))

    found = of(audit, "GPU218")

    assert set(found) == {"Namespace/team-a"}
    failure = found["Namespace/team-a"]
    assert (failure.result, failure.action, failure.severity) == (model.Result.FAIL, model.Action.WARN, findings.Severity.MEDIUM)
    assert failure.subject == findings.ObjectRef(namespace="", kind="Namespace", name="team-a", api_version="v1")
    assert failure.message == (
        "GPU218: no namespace holds more GPU memory or whole cards than its budget: namespace team-a is over "
        "budget 'team-a' (32Gi of GPU memory): 42 GiB of GPU memory used > 32 GiB; charged: "
        "Pod team-a/a 16 GiB and 1 whole card, Pod team-a/b 16 GiB and 1 whole card, Pod team-a/c 10 GiB"
    )
    assert [(r.kind, r.name) for r in failure.related] == [("Pod", "a"), ("Pod", "b"), ("Pod", "c")]
    assert not failure.enforced  # warn: the extender places no more of the namespace's pods, nothing is evicted


def test_a_namespace_within_its_budget_passes_and_finished_pods_and_other_namespaces_hold_nothing() -> None:
    audit = run(
        node("gpu-0"),
        namespace("team-a"),
        namespace("team-b"),
        pod("a"),
        pod("b"),
        pod("done", phase="Succeeded"),
        pod("pending", node_name=None),
        pod("other", namespace="team-b", limits={"nvidia.com/gpu": 8}),
    )

    found = of(audit, "GPU218")

    assert set(found) == {"Namespace/team-a"}  # team-b has no budget: unlimited, not judged
    assert found["Namespace/team-a"].result is model.Result.PASS
    assert found["Namespace/team-a"].message == (
        "namespace team-a holds 32 GiB and 2 whole cards of budget 'team-a' (32Gi of GPU memory)"
    )


def test_whole_cards_over_the_cards_budget_fail() -> None:
    config = {"gpuBudgets": [{"name": "two-cards", "namespaces": ["team-a"], "memory": "1Ti", "cards": 1}]}

    failure = of(run(node("gpu-0"), pod("a", limits={"nvidia.com/gpu": 2}), config=config), "GPU218")["Namespace/team-a"]

    assert failure.result is model.Result.FAIL
    assert "2 whole cards used > 1" in failure.message


def test_a_selector_budget_reads_the_namespace_labels_and_leaves_unlabelled_namespaces_unlimited() -> None:
    config = {"gpuBudgets": [{"name": "ml", "namespaceSelector": {"matchLabels": {"team": "ml"}}, "memory": "16Gi"}]}

    audit = run(
        node("gpu-0"),
        namespace("ml-1", {"team": "ml"}),
        namespace("web"),
        pod("a", namespace="ml-1", limits={"nvidia.com/gpu": 2}),
        pod("b", namespace="web", limits={"nvidia.com/gpu": 2}),
        config=config,
    )

    found = of(audit, "GPU218")
    assert set(found) == {"Namespace/ml-1"}
    assert found["Namespace/ml-1"].result is model.Result.FAIL
    assert "32 GiB of GPU memory used > 16 GiB" in found["Namespace/ml-1"].message


def ledger_lease(entries: dict[str, budgets.Entry], *, home: str = "gpu-admission") -> dict[str, Any]:
    return budgets.lease_body("team-a", entries, "extender-0", home=home)


def test_the_ledger_counts_pods_not_yet_bound_but_not_gone_pods_nor_leases_outside_the_ledger_namespace() -> None:
    waiting = budgets.Entry(
        uid="uid-team-a-waiting", pod="team-a/waiting", charge=budgets.Charge(memory_mib=20480), assumed_at=NOW - 5
    )
    gone = budgets.Entry(uid="uid-gone", pod="team-a/gone", charge=budgets.Charge(memory_mib=100 * 1024), assumed_at=NOW - 5)
    lease = ledger_lease({"uid-team-a-waiting": waiting, "uid-gone": gone})
    forged = ledger_lease({"uid-gone": gone}, home="team-a")  # a tenant's copy in its own namespace

    audit = run(node("gpu-0"), namespace("team-a"), lease, forged, pod("a"), pod("waiting", node_name=None))

    failure = of(audit, "GPU218")["Namespace/team-a"]
    assert failure.result is model.Result.FAIL
    assert "36 GiB of GPU memory used > 32 GiB" in failure.message  # 16 bound + 20 in the ledger; the gone pod's 100 not
    assert failure.related[0].kind == "Lease" and failure.related[0].namespace == "gpu-admission"
    assert "Pod team-a/waiting 20 GiB" in failure.message


def claim(name: str, *, device: str = "gpu-0-mig") -> dict[str, Any]:
    results = [{"driver": "gpu.nvidia.com", "pool": "gpu-0", "device": device, "request": "gpu"}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-claim-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
        "status": {"allocation": {"devices": {"results": results}}},
    }


SLICE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceSlice",
    "metadata": {"name": "gpu-0-slice"},
    "spec": {
        "driver": "gpu.nvidia.com",
        "pool": {"name": "gpu-0", "generation": 1, "resourceSliceCount": 1},
        "nodeName": "gpu-0",
        "devices": [
            {"name": "gpu-0-mig", "capacity": {"memory": {"value": "20Gi"}}},
            {"name": "gpu-0-bare", "attributes": {"uuid": {"string": "GPU-1"}}},
        ],
    },
}


def test_an_allocated_dra_claim_is_charged_its_device_memory() -> None:
    failure = of(run(node("gpu-0"), SLICE, claim("train"), pod("a")), "GPU218")["Namespace/team-a"]

    assert failure.result is model.Result.FAIL
    assert "ResourceClaim team-a/train 20 GiB" in failure.message and "36 GiB of GPU memory used" in failure.message


def test_budgets_are_judged_only_in_whole_cluster_audits() -> None:
    audit = run(node("gpu-0"), pod("a"), pod("b"), pod("c"), scope=scan.Scope(namespaces=frozenset({"team-a"})))

    assert not of(audit, "GPU218") and not of(audit, "GPU219")


# --- GPU219 ------------------------------------------------------------------------------------------


def test_a_pod_on_a_node_whose_card_memory_nothing_states_fails_and_one_with_it_passes() -> None:
    audit = run(node("gpu-0"), node("bare", card_mib=None), pod("known"), pod("unknown", node_name="bare"))

    found = of(audit, "GPU219")

    assert found["Pod/known"].result is model.Result.PASS
    assert found["Pod/known"].message == "charged 16 GiB and 1 whole card to budget 'team-a' (32Gi of GPU memory)"
    failure = found["Pod/unknown"]
    assert (failure.result, failure.action) == (model.Result.FAIL, model.Action.WARN)
    assert failure.subject.namespace == "team-a" and failure.subject.uid == "uid-team-a-unknown"
    assert "nvidia.com/gpu: the card memory of node bare is unknown" in failure.message
    assert "(counted: 0 GiB and 1 whole card)" in failure.message


def test_a_claim_whose_device_publishes_no_memory_fails() -> None:
    found = of(run(node("gpu-0"), SLICE, claim("mig"), claim("bare", device="gpu-0-bare")), "GPU219")

    assert found["ResourceClaim/mig"].result is model.Result.PASS
    failure = found["ResourceClaim/bare"]
    assert failure.result is model.Result.FAIL
    assert failure.subject.uid == "uid-claim-bare"
    assert "its ResourceSlice publishes no memory capacity" in failure.message


def test_pods_of_namespaces_without_a_budget_are_not_judged_and_exempt_namespaces_skip() -> None:
    config = {**BUDGET, "exemptNamespaces": ["team-a"]}
    unbudgeted = run(node("bare", card_mib=None), pod("x", namespace="team-b", node_name="bare"))
    exempt = run(node("bare", card_mib=None), pod("x", node_name="bare"), config=config)

    assert of(unbudgeted, "GPU219") == {}
    assert of(exempt, "GPU219")["Pod/x"].result is model.Result.SKIP


def test_no_budgets_means_no_budget_results() -> None:
    audit = run(node("gpu-0"), pod("a", limits={"nvidia.com/gpu": 8}), config={})

    assert not of(audit, "GPU218") and not of(audit, "GPU219")
