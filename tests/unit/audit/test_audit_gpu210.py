"""GPU210: a bound pod asking for extender-managed resources holds the allocation the extender made
for its request; pods placed past the extender, and forged or mismatched allocations, fail."""

from __future__ import annotations

import json

from policies import model, settings
from tests.unit.audit.conftest import NOW, NodeFactory, PodFactory, allocation, judge_pod
from webhook.audit import scan
from webhook.audit.checks import gpu203_orphaned_reservation, gpu210_unaccounted_pod

GPU203 = gpu203_orphaned_reservation.OrphanedReservation()
GPU210 = gpu210_unaccounted_pod.UnaccountedGpuPod()

FAIL, PASS = model.Result.FAIL, model.Result.PASS


def test_a_pod_placed_with_node_name_and_no_allocation_fails_at_enforce(pod: PodFactory) -> None:
    # The live case: 25 GiB on a node of 2 x 15 GiB cards, bound by nodeName; 25 <= 30, so the
    # node-level sum (GPU202) sees nothing wrong.
    placed = pod("big", node_name="cgpu-0", gpu_mem=25)
    found = judge_pod(GPU210, placed)
    assert found is not None
    assert (found.policy, found.rule, found.result, found.action) == ("GPU210", "unaccounted-gpu-pod", FAIL, model.Action.ENFORCE)
    assert found.message.startswith("GPU210: a bound pod asking for extender-managed GPU resources holds the allocation")
    assert (
        "it runs on node cgpu-0 asking for 25 GiB (aliyun.com/gpu-mem) on one card but holds no card allocation" in found.message
    )
    assert "recreate it without nodeName" in found.message


def test_whole_card_and_core_pods_without_allocation_fail_too(pod: PodFactory) -> None:
    whole = judge_pod(GPU210, pod("w", node_name="topo-0", limits={"aliyun.com/gpu": 2}))
    core = judge_pod(GPU210, pod("c", node_name="cm-0", limits={"aliyun.com/gpu-mem": 2, "aliyun.com/gpu-core.percentage": 30}))
    assert whole is not None and whole.result is FAIL and "2 whole cards (aliyun.com/gpu)" in whole.message
    assert core is not None and core.result is FAIL and "and 30% (aliyun.com/gpu-core.percentage)" in core.message


def test_an_allocation_of_another_size_than_the_request_fails(pod: PodFactory) -> None:
    forged = pod("small", node_name="cgpu-0", gpu_mem=12, annotations=allocation("cgpu-0", [1], mem=2))
    found = judge_pod(GPU210, forged)
    assert found is not None and found.result is FAIL
    assert (
        "on node cgpu-0: it asks for 12 GiB (aliyun.com/gpu-mem) on one card but its allocation counts 2 GiB on card 1"
        in found.message
    )


def test_a_gpushare_only_allocation_of_another_size_fails(pod: PodFactory) -> None:
    forged = pod(
        "old", node_name="cgpu-0", gpu_mem=12, annotations={"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "1"}
    )
    found = judge_pod(GPU210, forged)
    assert found is not None and found.result is FAIL and "counts 1 GiB on card 0" in found.message


def test_core_percentage_and_card_counts_must_match_too(pod: PodFactory) -> None:
    core = pod(
        "c",
        node_name="cm-0",
        limits={"aliyun.com/gpu-mem": 2, "aliyun.com/gpu-core.percentage": 50},
        annotations=allocation("cm-0", [0], mem=2, core=10),
    )
    whole = pod("w", node_name="topo-0", limits={"aliyun.com/gpu": 4}, annotations=allocation("topo-0", [0], whole=True))
    shared_as_whole = pod("s", node_name="cgpu-0", gpu_mem=2, annotations=allocation("cgpu-0", [0, 1], mem=2))
    for forged, said in ((core, "counts 10% on card 0"), (whole, "holds card 0"), (shared_as_whole, "holds card 0,1")):
        found = judge_pod(GPU210, forged)
        assert found is not None and found.result is FAIL, forged["metadata"]["name"]
        assert said in found.message


def test_gpushare_annotations_naming_another_card_than_ours_fail(pod: PodFactory) -> None:
    # The device plugin hands the container the card ALIYUN_COM_GPU_MEM_IDX names; the accounting
    # counts ours: the pod would use card 3 while card 1 is charged.
    notes = {**allocation("cgpu-0", [1], mem=4), "ALIYUN_COM_GPU_MEM_IDX": "3"}
    found = judge_pod(GPU210, pod("split", node_name="cgpu-0", gpu_mem=4, annotations=notes))
    assert found is not None and found.result is FAIL
    assert "ALIYUN_COM_GPU_MEM_IDX=3 names another card than its gpu-admission.io/allocation (card 1)" in found.message
    notes = {**allocation("cgpu-0", [1], mem=4), "ALIYUN_COM_GPU_MEM_POD": "1"}
    found = judge_pod(GPU210, pod("split", node_name="cgpu-0", gpu_mem=4, annotations=notes))
    assert found is not None and found.result is FAIL and "ALIYUN_COM_GPU_MEM_POD=1 differs" in found.message


def test_what_the_extender_wrote_passes(pod: PodFactory) -> None:
    shared = pod("ok", node_name="cgpu-0", gpu_mem=4, annotations=allocation("cgpu-0", [2], mem=4))
    core = pod(
        "c",
        node_name="cm-0",
        limits={"aliyun.com/gpu-mem": 2, "aliyun.com/gpu-core.percentage": 50},
        annotations=allocation("cm-0", [0], mem=2, core=50),
    )
    whole_notes = allocation("topo-0", [0, 1], whole=True)
    del whole_notes["ALIYUN_COM_GPU_MEM_POD"]  # bind writes no GiB for whole cards
    whole = pod("w", node_name="topo-0", limits={"aliyun.com/gpu": 2}, annotations=whole_notes)
    gpushare = pod("g", node_name="cgpu-0", gpu_mem=3, annotations={"ALIYUN_COM_GPU_MEM_IDX": "1", "ALIYUN_COM_GPU_MEM_POD": "3"})
    for fine in (shared, core, whole, gpushare):
        found = judge_pod(GPU210, fine)
        assert found is not None and found.result is PASS, (fine["metadata"]["name"], found and found.message)
    found = judge_pod(GPU210, shared)
    assert found is not None and found.message == "card 2 of node cgpu-0"


def test_it_does_not_apply_to_unbound_finished_non_gpu_or_malformed_pods(pod: PodFactory) -> None:
    assert judge_pod(GPU210, pod("pending", gpu_mem=4)) is None
    assert judge_pod(GPU210, pod("done", node_name="cgpu-0", gpu_mem=4, phase="Succeeded")) is None
    assert judge_pod(GPU210, pod("cpu", node_name="cgpu-0")) is None
    assert judge_pod(GPU210, pod("whole", node_name="gpu-0", limits={"nvidia.com/gpu": 1})) is None
    assert judge_pod(GPU210, pod("zero", node_name="cgpu-0", gpu_mem=0)) is None
    assert judge_pod(GPU210, pod("bad", node_name="cgpu-0", limits={"aliyun.com/gpu-mem": "lots"})) is None
    broken = pod("broken", node_name="cgpu-0", gpu_mem=4, annotations={"gpu-admission.io/allocation": "{not json"})
    found = judge_pod(GPU210, broken)
    assert found is not None and found.result is FAIL  # an unreadable allocation accounts nothing


def test_an_allocation_for_another_node_is_left_to_gpu203(pod: PodFactory) -> None:
    moved = pod("moved", node_name="cgpu-1", gpu_mem=4, annotations=allocation("cgpu-0", [0], mem=4))
    assert judge_pod(GPU210, moved) is None
    stale = judge_pod(GPU203, moved)
    assert stale is not None and stale.policy == "GPU203" and stale.result is FAIL


def test_a_forged_card_index_the_node_lacks_is_reported_by_gpu204_in_the_same_audit(node: NodeFactory, pod: PodFactory) -> None:
    forged = pod("ghost", node_name="cgpu-0", gpu_mem=4, annotations=allocation("cgpu-0", [9], mem=4))
    audit = scan.run(scan.Inventory(pods=(forged,), nodes=(node(),)), settings=settings.Settings(), now=NOW)
    failing = {(f.policy, f.subject.name) for f in audit.findings if f.result is FAIL}
    assert ("GPU204", "ghost") in failing
    passing = {(f.policy, f.subject.name) for f in audit.findings if f.result is PASS}
    assert ("GPU210", "ghost") in passing  # the size matches; the index is GPU204's to report


def test_the_audit_reports_it_for_a_bound_pod_and_not_gpu008(node: NodeFactory, pod: PodFactory) -> None:
    placed = pod("big", node_name="cgpu-0", gpu_mem=25)
    bound = pod("fine", node_name="cgpu-0", gpu_mem=4, annotations=allocation("cgpu-0", [0], mem=4))
    audit = scan.run(scan.Inventory(pods=(placed, bound), nodes=(node(),)), settings=settings.Settings(), now=NOW)
    gpu210 = {f.subject.name: f.result for f in audit.findings if f.policy == "GPU210"}
    assert gpu210 == {"big": FAIL, "fine": PASS}
    assert not [f for f in audit.findings if f.policy == "GPU008"]
    assert audit.exit_status == 1
    assert (
        json.dumps([f.message for f in audit.findings if f.policy == "GPU210" and f.result is FAIL]).count(
            "holds no card allocation"
        )
        == 1
    )
