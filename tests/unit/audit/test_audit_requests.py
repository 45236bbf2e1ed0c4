"""GPU202's per-node sums count a pod's GPU ask as Kubernetes does: sidecars add up, spellings are values."""

from __future__ import annotations

from typing import Any

from policies import model
from tests.unit.audit.conftest import NodeFactory, PodFactory, judge_node
from webhook.audit.checks import gpu202_card_overcommit

GPU202 = gpu202_card_overcommit.CardOvercommitted()

FAIL, PASS = model.Result.FAIL, model.Result.PASS


def with_sidecar(pod: dict[str, Any], limits: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["initContainers"] = [
        {"name": "proxy", "image": "proxy:1", "restartPolicy": "Always", "resources": {"limits": limits}}
    ]
    return pod


def overcommit(node: dict[str, Any], pods: list[dict[str, Any]]) -> Any:
    return judge_node(GPU202, node, pods)


def test_a_sidecar_asking_for_a_card_counts_beside_the_main_container(node: NodeFactory, pod: PodFactory) -> None:
    exclusive = node("excl-0", mode="default", capacity={"nvidia.com/gpu": "2"})
    mesh = with_sidecar(pod("mesh", node_name="excl-0", limits={"nvidia.com/gpu": 1}), {"nvidia.com/gpu": 1})
    other = pod("other", node_name="excl-0", limits={"nvidia.com/gpu": 1})

    found = overcommit(exclusive, [mesh, other])

    assert found is not None and found.result is FAIL
    assert "pods bound to the node ask for nvidia.com/gpu=3, the node has 2" in found.message


def test_an_ordinary_init_container_does_not_add_up(node: NodeFactory, pod: PodFactory) -> None:
    exclusive = node("excl-0", mode="default", capacity={"nvidia.com/gpu": "2"})
    warm = pod("warm", node_name="excl-0", limits={"nvidia.com/gpu": 1})
    warm["spec"]["initContainers"] = [{"name": "setup", "image": "s:1", "resources": {"limits": {"nvidia.com/gpu": 1}}}]
    other = pod("other", node_name="excl-0", limits={"nvidia.com/gpu": 1})

    found = overcommit(exclusive, [warm, other])

    assert found is not None and found.result is PASS


def test_mig_slices_are_summed_against_the_nodes_mig_capacity(node: NodeFactory, pod: PodFactory) -> None:
    mig = node("mig-0", mode="default", capacity={"nvidia.com/gpu": "0", "nvidia.com/mig-1g.5gb": "2"})
    pods = [pod(name, node_name="mig-0", limits={"nvidia.com/mig-1g.5gb": 1}) for name in ("a", "b")]

    assert overcommit(mig, pods).result is PASS
    found = overcommit(mig, [*pods, pod("c", node_name="mig-0", limits={"nvidia.com/mig-1g.5gb": "1"})])
    assert found.result is FAIL
    assert "nvidia.com/mig-1g.5gb=3, the node has 2" in found.message


def test_odd_spellings_are_counted_by_value(node: NodeFactory, pod: PodFactory) -> None:
    exclusive = node("excl-0", mode="default", capacity={"nvidia.com/gpu": "4"})
    pods = [
        pod("a", node_name="excl-0", limits={"nvidia.com/gpu": "2000m"}),
        pod("b", node_name="excl-0", limits={"nvidia.com/gpu": "+2"}),
    ]

    assert overcommit(exclusive, pods).result is PASS
    found = overcommit(exclusive, [*pods, pod("c", node_name="excl-0", limits={"nvidia.com/gpu": "1e0"})])
    assert found.result is FAIL and "nvidia.com/gpu=5, the node has 4" in found.message
