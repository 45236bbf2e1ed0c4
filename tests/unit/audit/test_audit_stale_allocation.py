"""GPU212 stale-allocation: cards held by pods that are gone (a ledger entry the extender should have
released, a pod Terminating long past its deadline) fail; live holders and fresh entries pass."""

from __future__ import annotations

from typing import Any

from policies import gpu, model
from policies.gpu import allocation as allocation_
from policies.gpu import reasons, reservations
from tests.unit.audit.conftest import NOW, NodeFactory, PodFactory, allocation, judge_node
from webhook.audit.checks import gpu212_stale_allocation

GPU212 = gpu212_stale_allocation.StaleAllocation()


def _ledger(uid: str, *, assumed_at: float) -> dict[str, str]:
    entry = allocation_.Allocation(
        uid=uid,
        namespace="team-a",
        name="deleted",
        node="cgpu-0",
        cards=(1,),
        memory_gib=8,
        assumed_at=assumed_at,
        expires=assumed_at + 3600,
        source="reservation",
    )
    return {gpu.RESERVATIONS_ANNOTATION: reservations.encode({uid: entry})}


def _judge(node: dict[str, Any], pods: list[dict[str, Any]]) -> Any:
    return judge_node(GPU212, node, pods)


def test_a_ledger_entry_of_a_gone_pod_past_the_prune_deadline_fails(node: NodeFactory) -> None:
    found = _judge(node(annotations=_ledger("gone", assumed_at=NOW - reasons.PRUNE_DEADLINE_S - 1)), [])
    assert found.policy == "GPU212" and found.result is model.Result.FAIL and found.action is model.Action.WARN
    assert "team-a/deleted (uid gone, gone) still holds 8 GiB on card 1" in found.message


def test_a_fresh_ledger_entry_of_a_gone_pod_is_left_to_the_extender(node: NodeFactory) -> None:
    found = _judge(node(annotations=_ledger("gone", assumed_at=NOW - 5)), [])
    assert found.result is model.Result.PASS


def test_a_ledger_entry_of_a_live_pod_passes(node: NodeFactory, pod: PodFactory) -> None:
    live = pod("deleted", uid="live", gpu_mem=8)
    found = _judge(node(annotations=_ledger("live", assumed_at=NOW - 600)), [live])
    assert found.result is model.Result.PASS


def test_a_pod_terminating_long_past_its_deadline_fails_and_a_recent_one_passes(node: NodeFactory, pod: PodFactory) -> None:
    stuck = pod("stuck", node_name="cgpu-0", gpu_mem=4, annotations=allocation("cgpu-0", [0], mem=4))
    stuck["metadata"]["deletionTimestamp"] = allocation_.timestamp(NOW - reasons.STUCK_TERMINATING_S - 60)
    found = _judge(node(), [stuck])
    assert found.result is model.Result.FAIL
    assert "team-a/stuck has been Terminating 360 s past its deletion deadline" in found.message
    assert "force-delete" in found.message
    leaving = pod("leaving", node_name="cgpu-0", gpu_mem=4, annotations=allocation("cgpu-0", [0], mem=4))
    leaving["metadata"]["deletionTimestamp"] = allocation_.timestamp(NOW - 30)
    assert _judge(node(), [leaving]).result is model.Result.PASS


def test_a_node_without_cards_is_not_judged(node: NodeFactory) -> None:
    assert _judge(node("cpu-0", mode=None, capacity={}), []) is None
