"""Each consistency check GPU201-GPU208 with a passing and a failing case."""

from __future__ import annotations

import json

from policies import model
from tests.unit.audit.conftest import NodeFactory, PodFactory, WorkloadFactory, allocation, judge_node, judge_pod
from webhook.audit import findings
from webhook.audit.checks import (
    base,
    facts,
    gpu201_gpu_access,
    gpu202_card_overcommit,
    gpu203_orphaned_reservation,
    gpu204_missing_card,
    gpu205_mode_resources,
    gpu206_card_model_labels,
    gpu207_mode_selector,
    gpu208_mode_resource_missing,
)

GPU201 = gpu201_gpu_access.GpuAccessWithoutRequest()
GPU202 = gpu202_card_overcommit.CardOvercommitted()
GPU203 = gpu203_orphaned_reservation.OrphanedReservation()
GPU204 = gpu204_missing_card.MissingCard()
GPU205 = gpu205_mode_resources.ModeResourceMismatch()
GPU206 = gpu206_card_model_labels.CardModelLabels()
GPU207 = gpu207_mode_selector.ModeSelector()
GPU208 = gpu208_mode_resource_missing.ModeResourceMissing()

FAIL, PASS, WARN = model.Result.FAIL, model.Result.PASS, model.Result.WARN


# --- GPU201 ---------------------------------------------------------------------------------------


def test_gpu201_a_privileged_pod_without_gpus_on_a_gpu_node_fails_at_enforce(node: NodeFactory, pod: PodFactory) -> None:
    found = judge_pod(GPU201, pod("agent", node_name="cgpu-0", privileged=True), node=node())
    assert found is not None
    assert (found.policy, found.result, found.action) == ("GPU201", FAIL, model.Action.ENFORCE)
    assert 'container "main" is privileged' in found.message
    assert found.message.startswith(
        "GPU201: pods on GPU nodes that request no GPU must not be able to reach the cards: on GPU node cgpu-0"
    )
    assert findings.ObjectRef(namespace="", kind="Node", name="cgpu-0", api_version="v1", uid="uid-node-cgpu-0") in found.related


def test_gpu201_a_device_host_path_fails(node: NodeFactory, pod: PodFactory) -> None:
    volumes = [{"name": "dev", "hostPath": {"path": "/dev"}}]
    found = judge_pod(GPU201, pod("mounts", node_name="cgpu-0", volumes=volumes), node=node())
    assert found is not None and found.result is FAIL
    assert 'volume "dev" mounts hostPath /dev' in found.message


def test_gpu201_the_visible_devices_bypass_fails(node: NodeFactory, pod: PodFactory) -> None:
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    found = judge_pod(GPU201, pod("sneaky", node_name="cgpu-0", env=env), node=node())
    assert found is not None and found.result is FAIL
    assert "sets NVIDIA_VISIBLE_DEVICES=all" in found.message


def test_gpu201_a_container_without_void_is_an_uncertain_warning(node: NodeFactory, pod: PodFactory) -> None:
    found = judge_pod(GPU201, pod("plain", node_name="cgpu-0"), node=node())
    assert found is not None
    assert (found.result, found.action) == (WARN, model.Action.WARN)
    assert "an image that defaults it to all would see every card" in found.message


def test_gpu201_passes_with_void_and_for_pods_that_request_gpus(node: NodeFactory, pod: PodFactory) -> None:
    void = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    safe = judge_pod(GPU201, pod("safe", node_name="cgpu-0", env=void), node=node())
    asked = judge_pod(GPU201, pod("gpu", node_name="cgpu-0", gpu_mem=3, privileged=True), node=node())
    assert safe is not None and safe.result is PASS
    assert asked is not None and asked.result is PASS


def test_gpu201_does_not_apply_off_gpu_nodes_unbound_or_finished_pods(node: NodeFactory, pod: PodFactory) -> None:
    cpu = node("cpu-0", mode=None, capacity={})
    assert judge_pod(GPU201, pod("a", node_name="cpu-0", privileged=True), node=cpu) is None
    assert judge_pod(GPU201, pod("b", privileged=True), node=node()) is None
    assert judge_pod(GPU201, pod("c", node_name="cgpu-0", privileged=True, phase="Succeeded"), node=node()) is None
    assert judge_pod(GPU201, pod("d", node_name="gone", privileged=True), node=None) is None


# --- GPU202 ---------------------------------------------------------------------------------------


def test_gpu202_a_card_with_more_memory_allocated_than_it_has_fails(node: NodeFactory, pod: PodFactory) -> None:
    gpu_node = node()
    pods = [
        pod("a", node_name="cgpu-0", gpu_mem=10, annotations=allocation("cgpu-0", [0], mem=10)),
        pod("b", node_name="cgpu-0", gpu_mem=10, annotations=allocation("cgpu-0", [0], mem=10)),
    ]
    found = judge_node(GPU202, gpu_node, pods)
    assert found is not None
    assert (found.policy, found.result, found.action) == ("GPU202", FAIL, model.Action.ENFORCE)
    assert "card 0: 20 GiB allocated of 15 GiB (Pod/a, Pod/b)" in found.message
    assert {ref.name for ref in found.related} == {"a", "b"}


def test_gpu202_more_than_all_the_cores_of_a_card_fails(node: NodeFactory, pod: PodFactory) -> None:
    gpu_node = node("core-0", mode="core_mem")
    limits = {"aliyun.com/gpu-core.percentage": 60}
    pods = [
        pod(name, node_name="core-0", gpu_mem=2, limits=limits, annotations=allocation("core-0", [1], mem=2, core=60))
        for name in ("a", "b")
    ]
    found = judge_node(GPU202, gpu_node, pods)
    assert found is not None and found.result is FAIL
    assert "card 1: 120% of the cores" in found.message


def test_gpu202_a_whole_card_shared_with_another_pod_fails(node: NodeFactory, pod: PodFactory) -> None:
    gpu_node = node("topo-0", mode="topology", labels={"gpu-admission.io/gpu-memory-mib": "32768"})
    whole = pod("whole", node_name="topo-0", limits={"aliyun.com/gpu": 1}, annotations=allocation("topo-0", [2], whole=True))
    other = pod("other", node_name="topo-0", limits={"aliyun.com/gpu": 1}, annotations=allocation("topo-0", [2], whole=True))
    found = judge_node(GPU202, gpu_node, [whole, other])
    assert found is not None and found.result is FAIL
    assert "card 2: held whole by one pod but shared by 2" in found.message


def test_gpu202_pods_bound_past_the_scheduler_beyond_node_capacity_fail(node: NodeFactory, pod: PodFactory) -> None:
    exclusive = node("excl-0", mode="default", capacity={"nvidia.com/gpu": "2"})
    pods = [pod(name, node_name="excl-0", limits={"nvidia.com/gpu": 1}) for name in ("a", "b", "c")]
    found = judge_node(GPU202, exclusive, pods)
    assert found is not None and found.result is FAIL
    assert "pods bound to the node ask for nvidia.com/gpu=3, the node has 2" in found.message


def test_gpu202_allocations_within_capacity_pass(node: NodeFactory, pod: PodFactory) -> None:
    gpu_node = node()
    pods = [
        pod("a", node_name="cgpu-0", gpu_mem=10, annotations=allocation("cgpu-0", [0], mem=10)),
        pod("b", node_name="cgpu-0", gpu_mem=5, annotations=allocation("cgpu-0", [0], mem=5)),
        pod("done", node_name="cgpu-0", gpu_mem=15, annotations=allocation("cgpu-0", [0], mem=15), phase="Succeeded"),
    ]
    found = judge_node(GPU202, gpu_node, pods)
    assert found is not None and found.result is PASS
    assert found.message == "15 of 60 GiB allocated"


def test_gpu202_a_gpushare_annotation_made_by_hand_is_read_too(node: NodeFactory, pod: PodFactory) -> None:
    gpu_node = node()
    by_hand = pod(
        "by-hand", node_name="cgpu-0", gpu_mem=3, annotations={"ALIYUN_COM_GPU_MEM_IDX": "1", "ALIYUN_COM_GPU_MEM_POD": "40"}
    )
    found = judge_node(GPU202, gpu_node, [by_hand])
    assert found is not None and found.result is FAIL
    assert "card 1: 40 GiB allocated of 15 GiB (Pod/by-hand)" in found.message


# --- GPU203 ---------------------------------------------------------------------------------------


def test_gpu203_an_allocation_naming_another_node_than_the_bound_one_fails(pod: PodFactory) -> None:
    moved = pod("moved", node_name="cgpu-1", gpu_mem=3, annotations=allocation("cgpu-0", [0], mem=3))
    found = judge_pod(GPU203, moved)
    assert found is not None
    assert (found.policy, found.result, found.action) == ("GPU203", FAIL, model.Action.WARN)
    assert "reserves cards on node cgpu-0, but it is bound to cgpu-1" in found.message


def test_gpu203_an_allocation_on_the_bound_node_passes(pod: PodFactory) -> None:
    found = judge_pod(GPU203, pod("ok", node_name="cgpu-0", gpu_mem=3, annotations=allocation("cgpu-0", [0], mem=3)))
    assert found is not None and found.result is PASS
    assert judge_pod(GPU203, pod("none", node_name="cgpu-0")) is None


def _ledger(entries: dict[str, dict[str, object]]) -> dict[str, str]:
    return {"gpu-admission.io/reservations": json.dumps(entries)}


def _entry(pod_key: str, *, expires: str = "2025-06-15T16:00:00.000Z") -> dict[str, object]:
    return {
        "pod": pod_key,
        "node": "cgpu-0",
        "cards": [1],
        "memGiB": 4,
        "corePercent": 0,
        "whole": False,
        "assumedAt": "2025-06-15T15:06:00.000Z",
        "expires": expires,
    }


def test_gpu203_a_ledger_reservation_for_a_pod_that_is_gone_finished_or_elsewhere_fails(
    node: NodeFactory, pod: PodFactory
) -> None:
    gpu_node = node(
        annotations=_ledger(
            {
                "uid-gone": _entry("team-a/gone"),
                "uid-done": _entry("team-a/done"),
                "uid-away": _entry("team-a/away"),
                "uid-late": _entry("team-a/late", expires="2025-06-15T15:00:00.000Z"),  # lapsed: holds nothing
            }
        )
    )
    pods = {
        "uid-done": pod("done", uid="uid-done", node_name="cgpu-0", phase="Failed"),
        "uid-away": pod("away", uid="uid-away", node_name="cgpu-1"),
    }
    found = judge_node(GPU203, gpu_node, pods_by_uid=pods)
    assert found is not None and found.result is FAIL
    assert "team-a/gone (uid uid-gone) holds card 1 but no longer exists" in found.message
    assert "team-a/done holds card 1 but has finished" in found.message
    assert "team-a/away holds card 1 but is bound to cgpu-1" in found.message
    assert "late" not in found.message
    assert {ref.name for ref in found.related} == {"gone", "done", "away"}


def test_gpu203_a_ledger_reservation_for_a_pod_being_bound_passes(node: NodeFactory, pod: PodFactory) -> None:
    gpu_node = node(annotations=_ledger({"uid-new": _entry("team-a/new")}))
    found = judge_node(GPU203, gpu_node, pods_by_uid={"uid-new": pod("new", uid="uid-new")})
    assert found is not None and found.result is PASS
    assert judge_node(GPU203, node(), pods_by_uid={}) is None


# --- GPU204 ---------------------------------------------------------------------------------------


def test_gpu204_a_card_index_the_node_does_not_have_fails(node: NodeFactory, pod: PodFactory) -> None:
    lost = pod("lost", node_name="cgpu-0", gpu_mem=3, annotations=allocation("cgpu-0", [7], mem=3))
    found = judge_pod(GPU204, lost, nodes={"cgpu-0": node()})
    assert found is not None
    assert (found.policy, found.result, found.action) == ("GPU204", FAIL, model.Action.ENFORCE)
    assert "it holds card 7 of node cgpu-0, whose cards are 0, 1, 2, 3" in found.message


def test_gpu204_an_allocation_on_a_node_that_is_gone_fails(pod: PodFactory) -> None:
    lost = pod("lost", node_name="cgpu-9", gpu_mem=3, annotations=allocation("cgpu-9", [0], mem=3))
    found = judge_pod(GPU204, lost, nodes={})
    assert found is not None and found.result is FAIL
    assert "node cgpu-9, which no longer exists" in found.message


def test_gpu204_an_existing_card_passes(node: NodeFactory, pod: PodFactory) -> None:
    fine = pod("fine", node_name="cgpu-0", gpu_mem=3, annotations=allocation("cgpu-0", [3], mem=3))
    found = judge_pod(GPU204, fine, nodes={"cgpu-0": node()})
    assert found is not None and found.result is PASS
    assert judge_pod(GPU204, pod("none", node_name="cgpu-0"), nodes={"cgpu-0": node()}) is None


# --- GPU205 ---------------------------------------------------------------------------------------


def test_gpu205_another_modes_resource_on_a_node_fails(node: NodeFactory) -> None:
    mixed = node(capacity={"aliyun.com/gpu-mem": "60", "aliyun.com/gpu-count": "4", "nvidia.com/gpu": "4"})
    found = judge_node(GPU205, mixed)
    assert found is not None
    assert (found.policy, found.result, found.action) == ("GPU205", FAIL, model.Action.ENFORCE)
    assert "the node is in mode cgpu but advertises nvidia.com/gpu=4" in found.message
    assert found.namespace == ""  # a node: the ClusterPolicyReport


def test_gpu205_an_unknown_mode_fails(node: NodeFactory) -> None:
    found = judge_node(GPU205, node(mode="fast"))
    assert found is not None and found.result is FAIL
    assert "ack.node.gpu.schedule=fast is no mode" in found.message


def test_gpu205_a_node_advertising_its_own_mode_only_passes(node: NodeFactory) -> None:
    for mode in ("cgpu", "share", "core_mem", "topology", "default"):
        found = judge_node(GPU205, node(mode=mode))
        assert found is not None and found.result is PASS, (mode, found)
    assert judge_node(GPU205, node("cpu-0", mode=None, capacity={})) is None


# --- GPU206 ---------------------------------------------------------------------------------------


def test_gpu206_a_gpu_node_without_card_model_labels_fails(node: NodeFactory) -> None:
    found = judge_node(GPU206, node(card_labels=False))
    assert found is not None
    assert (found.policy, found.result, found.action) == ("GPU206", FAIL, model.Action.WARN)
    assert (
        "missing aliyun.accelerator/nvidia_name, aliyun.accelerator/nvidia_mem, aliyun.accelerator/nvidia_count" in found.message
    )


def test_gpu206_a_node_with_gpu_capacity_only_is_a_gpu_node_too(node: NodeFactory) -> None:
    found = judge_node(GPU206, node("plain", mode=None, capacity={"nvidia.com/gpu": "1"}))
    assert found is not None and found.result is FAIL


def test_gpu206_a_labelled_node_passes(node: NodeFactory) -> None:
    found = judge_node(GPU206, node())
    assert found is not None and found.result is PASS
    assert judge_node(GPU206, node("cpu-0", mode=None, capacity={})) is None


# --- GPU207 ---------------------------------------------------------------------------------------


def test_gpu207_a_gpu_mem_workload_without_a_mode_selector_fails(pod: PodFactory, workload: WorkloadFactory) -> None:
    found = GPU207.check_template(workload("StatefulSet", "cgpu-test", pod=pod(gpu_mem=3)))
    assert found is not None
    assert (found.policy, found.result, found.action) == ("GPU207", FAIL, model.Action.WARN)
    assert "no nodeSelector ack.node.gpu.schedule" in found.message
    assert found.subject.kind == "StatefulSet"


def test_gpu207_an_affinity_allowing_two_shared_modes_fails(pod: PodFactory) -> None:
    either = pod(gpu_mem=3)
    either["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "ack.node.gpu.schedule", "operator": "In", "values": ["cgpu", "share"]}]}
                ]
            }
        }
    }
    found = GPU207.check_template(either)
    assert found is not None and found.result is FAIL
    assert "allows cgpu, share; pick one" in found.message


def test_gpu207_a_pinned_mode_passes_and_other_families_are_not_judged(pod: PodFactory) -> None:
    pinned = GPU207.check_template(pod(gpu_mem=3, node_selector={"ack.node.gpu.schedule": "cgpu"}))
    assert pinned is not None and pinned.result is PASS
    assert GPU207.check_template(pod(limits={"nvidia.com/gpu": 1})) is None
    assert GPU207.check_template(pod(gpu_mem=3, limits={"aliyun.com/gpu-core.percentage": 30})) is None
    assert GPU207.check_template(pod()) is None


# --- GPU208 ---------------------------------------------------------------------------------------


def test_gpu208_a_gpu_node_advertising_none_of_its_modes_resource_fails(node: NodeFactory) -> None:
    found = judge_node(GPU208, node(mode="default", capacity={"nvidia.com/gpu": "0"}))
    assert found is not None
    assert (found.policy, found.result, found.action) == ("GPU208", FAIL, model.Action.WARN)
    assert "the node is in mode default but advertises no nvidia.com/gpu; is its device plugin running?" in found.message


def test_gpu208_a_node_advertising_its_resource_passes(node: NodeFactory) -> None:
    found = judge_node(GPU208, node(mode="core_mem"))
    assert found is not None and found.result is PASS
    assert judge_node(GPU208, node(mode="fast")) is None  # GPU205 reports an unknown mode


def test_quantities_parse_like_the_apiserver_writes_them(node: NodeFactory) -> None:
    capacity = {"nvidia.com/gpu": "4", "aliyun.com/gpu-mem": "1k", "aliyun.com/gpu": "2Ki", "aliyun.com/gpu-count": " 3 "}
    odd = {"nvidia.com/mig-1g.5gb": "2000m", "aliyun.com/gpu-core.percentage": "1.5", "nvidia.com/gpu.shared": "x"}
    assert facts.capacity(node(capacity={**capacity, **odd})) == {
        "nvidia.com/gpu": 4,
        "aliyun.com/gpu-mem": 1000,
        "aliyun.com/gpu": 2048,
        "aliyun.com/gpu-count": 3,
        "nvidia.com/mig-1g.5gb": 2,
        "aliyun.com/gpu-core.percentage": 0,
        "nvidia.com/gpu.shared": 0,
    }


def test_gpu202_names_a_few_pods_of_a_crowded_card_and_counts_the_rest(node: NodeFactory, pod: PodFactory) -> None:
    gpu_node = node()
    pods = [pod(f"p{i:03}", node_name="cgpu-0", gpu_mem=1, annotations=allocation("cgpu-0", [0], mem=1)) for i in range(300)]
    found = judge_node(GPU202, gpu_node, pods)
    assert found is not None and found.result is FAIL
    assert "Pod/p009 and 290 more)" in found.message
    assert len(found.message) < 1000
    assert len(found.related) == base.MAX_RELATED
