"""GPU213-GPU215: the audit against the labeler's usage summary (real use beside the accounting)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from policies import gpu, model
from policies import settings as settings_
from policies.gpu import inventory, usage
from tests.unit.audit.conftest import allocation, judge_node, judge_pod
from webhook.audit import scan
from webhook.audit.checks import base, gpu213_out_of_band, gpu214_pod_over_request, gpu215_card_over_allocation

GPU213 = gpu213_out_of_band.OutOfBandProcesses()
GPU214 = gpu214_pod_over_request.PodExceedsRequest()
GPU215 = gpu215_card_over_allocation.CardUseExceedsAllocations()

NodeFactory = Callable[..., dict[str, Any]]
PodFactory = Callable[..., dict[str, Any]]
PASS, FAIL = model.Result.PASS, model.Result.FAIL
NOW = 1_750_000_000.0
CID = "3f1e" + "0" * 60


def summary(*card_uses: usage.CardUse) -> dict[str, str]:
    return {usage.USAGE_ANNOTATION: usage.render(usage.NodeUsage(cards=card_uses))}


def card(index: int = 0, **fields: Any) -> usage.CardUse:
    return usage.CardUse(index=index, total_mib=15360, **fields)


def inventory_annotation(count: int = 2) -> dict[str, str]:
    return {
        gpu.INVENTORY_ANNOTATION: inventory.encode_inventory(
            [inventory.Card(index=i, memory_mib=15 * 1024) for i in range(count)]
        )
    }


def pod_use(uid: str, mib: int) -> usage.PodUse:
    return usage.PodUse(uid=uid, namespace="team-a", name=uid, used_mib=mib)


# --- GPU213 ------------------------------------------------------------------------------------------


def test_gpu213_names_node_card_pid_memory_and_container(node: NodeFactory) -> None:
    oob = usage.OutOfBand(pid=41233, used_mib=5200, container_id=CID)
    found = judge_node(GPU213, node("share-0", mode="share", annotations=summary(card(1, out_of_band=(oob,)))))
    assert found is not None and found.result is FAIL and found.action is model.Action.ENFORCE
    assert found.policy == "GPU213" and found.subject.kind == "Node" and found.subject.name == "share-0"
    assert (
        "on node share-0: card 1: pid 41233 holds 5200 MiB in container 3f1e00000000, started on the node outside Kubernetes"
        in found.message
    )


def test_gpu213_tells_a_pod_cgroup_the_apiserver_lacks_and_a_bare_host_process(node: NodeFactory) -> None:
    entries = (usage.OutOfBand(pid=7, used_mib=100, pod_uid="gone-uid"), usage.OutOfBand(pid=8))
    found = judge_node(GPU213, node(annotations=summary(card(0, out_of_band=entries))))
    assert found is not None and found.result is FAIL
    assert "pid 7 holds 100 MiB in the cgroup of pod UID gone-uid, which the apiserver does not have" in found.message
    assert "pid 8 holds ? MiB, a process outside any container" in found.message


def test_gpu213_passes_when_every_process_is_a_pods(node: NodeFactory) -> None:
    found = judge_node(GPU213, node(annotations=summary(card(0, used_mib=900, pods=(pod_use("u", 800),)))))
    assert found is not None and found.result is PASS


def test_gpu213_passes_when_processes_are_unknown_even_past_the_list_limit(node: NodeFactory) -> None:
    # A labeler without the host's /proc (the base's, without deploy/components/process-attribution)
    # reads every process as unknown: not a bypass, however many (the list is cut, `truncated` counts
    # the rest, and that count alone must not read as out-of-band processes).
    unknown = tuple(range(1000, 1000 + usage.MAX_ENTRIES + 8))
    annotations = summary(
        card(0, used_mib=9000, pods=tuple(pod_use(f"u{i}", 10) for i in range(usage.MAX_ENTRIES + 3)), unknown=unknown)
    )
    assert usage.parse(annotations[usage.USAGE_ANNOTATION]).cards[0].truncated == 11  # type: ignore[union-attr]
    found = judge_node(GPU213, node(annotations=annotations))
    assert found is not None and found.result is PASS


def test_gpu213_counts_what_a_full_out_of_band_list_left_out(node: NodeFactory) -> None:
    entries = tuple(usage.OutOfBand(pid=pid, used_mib=10) for pid in range(1, usage.MAX_ENTRIES + 5))
    found = judge_node(GPU213, node(annotations=summary(card(0, out_of_band=entries))))
    assert found is not None and found.result is FAIL
    # The summary lists MAX_ENTRIES of them; the 4 it left out are one more problem named.
    assert f"and {usage.MAX_ENTRIES + 1 - base.MAX_NAMED} more;" in found.message


@pytest.mark.parametrize("annotation", [None, "", "{not json", '{"cards": "x"}'])
def test_gpu213_does_not_judge_a_node_without_a_readable_summary(node: NodeFactory, annotation: str | None) -> None:
    annotations = {} if annotation is None else {usage.USAGE_ANNOTATION: annotation}
    assert judge_node(GPU213, node(annotations=annotations)) is None


# --- GPU214 ------------------------------------------------------------------------------------------


def share_node(node: NodeFactory, *uses: usage.CardUse, mode: str = "share") -> dict[str, Any]:
    return node("n-0", mode=mode, annotations={**summary(*uses), **inventory_annotation()})


def allocated_pod(pod: PodFactory, *, uid: str = "p1", cards_: tuple[int, ...] = (0,), mem: int = 4) -> dict[str, Any]:
    return pod("app", node_name="n-0", gpu_mem=mem, uid=uid, annotations=allocation("n-0", cards_, mem=mem))


def test_gpu214_on_share_any_excess_over_the_request_fails(node: NodeFactory, pod: PodFactory) -> None:
    found = judge_pod(GPU214, allocated_pod(pod), node=share_node(node, card(0, pods=(pod_use("p1", 4096 + 1),))))
    assert found is not None and found.result is FAIL and found.policy == "GPU214"
    assert (
        "its processes hold 4097 MiB on card 0 but it asked for 4 GiB (4096 MiB; share does not isolate memory)" in found.message
    )


def test_gpu214_on_share_exactly_the_request_passes(node: NodeFactory, pod: PodFactory) -> None:
    found = judge_pod(GPU214, allocated_pod(pod), node=share_node(node, card(0, pods=(pod_use("p1", 4096),))))
    assert found is not None and found.result is PASS and found.message == "uses 4096 MiB on card 0"


@pytest.mark.parametrize(("mib", "result"), [(4096 + 512, PASS), (4096 + 513, FAIL)])
def test_gpu214_on_an_isolating_mode_only_beyond_the_tolerance(
    node: NodeFactory, pod: PodFactory, mib: int, result: model.Result
) -> None:
    found = judge_pod(GPU214, allocated_pod(pod), node=share_node(node, card(0, pods=(pod_use("p1", mib),)), mode="cgpu"))
    assert found is not None and found.result is result


def test_gpu214_a_pod_using_a_card_it_was_not_given_fails_on_any_mode(node: NodeFactory, pod: PodFactory) -> None:
    uses = (card(0, pods=(pod_use("p1", 100),)), card(1, pods=(pod_use("p1", 50),)))
    found = judge_pod(GPU214, allocated_pod(pod), node=share_node(node, *uses, mode="cgpu"))
    assert found is not None and found.result is FAIL
    assert "its processes hold 50 MiB on card 1, which it was not given (its allocation: card 0)" in found.message


def test_gpu214_a_pod_asking_for_no_gpu_with_gpu_processes_fails(node: NodeFactory, pod: PodFactory) -> None:
    sneaky = pod("sneaky", node_name="n-0", uid="p9")
    found = judge_pod(GPU214, sneaky, node=share_node(node, card(0, pods=(pod_use("p9", 300),))))
    assert found is not None and found.result is FAIL
    assert "it asks for no GPU but its processes hold 300 MiB on card 0" in found.message


def test_gpu214_whole_card_pods_are_not_judged_on_memory(node: NodeFactory, pod: PodFactory) -> None:
    whole = pod("trainer", node_name="n-0", uid="w1", limits={"nvidia.com/gpu": 1})
    found = judge_pod(GPU214, whole, node=share_node(node, card(0, pods=(pod_use("w1", 15000),)), mode="default"))
    assert found is not None and found.result is PASS


def test_gpu214_leaves_pods_without_processes_finished_pods_and_nodes_without_summary_alone(
    node: NodeFactory, pod: PodFactory
) -> None:
    busy = share_node(node, card(0, pods=(pod_use("p1", 9999),)))
    assert judge_pod(GPU214, allocated_pod(pod, uid="other"), node=busy) is None
    finished = allocated_pod(pod)
    finished["status"]["phase"] = "Succeeded"
    assert judge_pod(GPU214, finished, node=busy) is None
    assert judge_pod(GPU214, allocated_pod(pod), node=node("n-0", mode="share")) is None
    assert judge_pod(GPU214, allocated_pod(pod), node=None) is None


# --- GPU215 ------------------------------------------------------------------------------------------


def test_gpu215_a_card_whose_processes_hold_more_than_its_allocations_fails(node: NodeFactory, pod: PodFactory) -> None:
    oob = usage.OutOfBand(pid=5, used_mib=6000)
    node_obj = share_node(node, card(0, pods=(pod_use("p1", 4000),), out_of_band=(oob,)), card(1))
    found = judge_node(GPU215, node_obj, [allocated_pod(pod)])
    assert found is not None and found.result is FAIL and found.policy == "GPU215"
    assert "card 0: processes hold 10000 MiB but allocations sum to 4 GiB (4096 MiB), 6000 MiB of it out-of-band" in found.message


def test_gpu215_use_within_the_allocations_and_tolerance_passes(node: NodeFactory, pod: PodFactory) -> None:
    node_obj = share_node(node, card(0, pods=(pod_use("p1", 4096 + 400),)))
    found = judge_node(GPU215, node_obj, [allocated_pod(pod)])
    assert found is not None and found.result is PASS


def test_gpu215_without_process_figures_the_cards_used_memory_counts(node: NodeFactory) -> None:
    node_obj = share_node(node, card(0, used_mib=2000, out_of_band=(usage.OutOfBand(pid=3),)))
    found = judge_node(GPU215, node_obj)
    assert found is not None and found.result is FAIL and "processes hold 2000 MiB but allocations sum to 0 GiB" in found.message


def test_gpu215_does_not_judge_exclusive_nodes_or_nodes_without_summary(node: NodeFactory) -> None:
    exclusive = node("d-0", mode="default", annotations=summary(card(0, used_mib=15000)))
    assert judge_node(GPU215, exclusive) is None
    plain = node("n-0", mode="share", annotations=inventory_annotation())
    assert judge_node(GPU215, plain) is None


# --- in the audit run --------------------------------------------------------------------------------


def test_the_audit_reports_the_three_checks_from_the_cluster_objects(node: NodeFactory, pod: PodFactory) -> None:
    oob = usage.OutOfBand(pid=41233, used_mib=6000, container_id=CID)
    node_obj = share_node(node, card(0, pods=(pod_use("p1", 5000),), out_of_band=(oob,)), card(1))
    objects = [node_obj, allocated_pod(pod)]
    result = scan.run(scan.Inventory.of(objects), settings=settings_.Settings(), now=NOW)
    by_policy = {f.policy: f for f in result.findings if f.policy in ("GPU213", "GPU214", "GPU215")}
    assert {p: f.result for p, f in by_policy.items()} == {"GPU213": FAIL, "GPU214": FAIL, "GPU215": FAIL}
    assert by_policy["GPU214"].subject.name == "app"
