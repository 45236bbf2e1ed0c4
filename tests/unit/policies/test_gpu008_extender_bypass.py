"""GPU008: a pod reaches a card only through the scheduler extender (nodeName, allocation annotations
on create and on update, schedulers that do not call the extender), and ordinary pods beside it pass."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest

from policies import engine, gpu, model, settings
from policies.gpu import allocation as allocation_  # `allocation` names a pod's allocation here
from policies.gpu import cardrequest
from tests.unit.policies.conftest import ContainerFactory, Evaluate, Patched, PodFactory, ResultOf, WorkloadFactory
from webhook.audit import scan

GPU_MEM = {"aliyun.com/gpu-mem": 4}
EXTENDER_LIMITS = [
    pytest.param({"aliyun.com/gpu-mem": 4}, id="gpu-mem"),
    pytest.param({"aliyun.com/gpu-mem": 4, "aliyun.com/gpu-core.percentage": 30}, id="gpu-mem+core"),
    pytest.param({"aliyun.com/gpu": 2}, id="whole-cards"),
]
ALLOCATION = json.dumps(
    {"node": "gpu-0", "cards": [1], "memGiB": 4, "corePercent": 0, "whole": False, "assumedAt": "2026-01-01T00:00:00.000Z"},
    separators=(",", ":"),
)
# What the extender's Binding leaves on a bound pod (allocation.bind_annotations' keys and shapes).
BOUND = {
    "ALIYUN_COM_GPU_MEM_IDX": "1",
    "ALIYUN_COM_GPU_MEM_POD": "4",
    "ALIYUN_COM_GPU_MEM_DEV": "15",
    "ALIYUN_COM_GPU_MEM_ASSIGNED": "false",
    "ALIYUN_COM_GPU_MEM_ASSUME_TIME": "1767225600000000000",
    "gpu-admission.io/allocation": ALLOCATION,
}
# A pod whose mutators have nothing to add, so the decision is GPU008's alone where it fails.
CGPU = {"nodeSelector": {"ack.node.gpu.schedule": "cgpu"}}


def gpu008(decision: model.Decision) -> list[str]:
    return [v.message for v in decision.violations if v.policy == "GPU008"]


def bound_pod(pod: Any, container: Any, **annotations: str) -> dict[str, Any]:
    """A running gpu-mem pod as the apiserver stores it after the extender's bind."""
    obj: dict[str, Any] = pod(
        container(gpu=GPU_MEM, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]),
        annotations={**BOUND, **annotations},
        nodeName="gpu-0",
        schedulerName="default-scheduler",
        **CGPU,
    )
    return obj


# --- (a) spec.nodeName ------------------------------------------------------------------------------


@pytest.mark.parametrize("limits", EXTENDER_LIMITS)
def test_a_pod_asking_for_an_extender_resource_may_not_name_its_node(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, limits: dict[str, int]
) -> None:
    decision = evaluate(pod(container("trainer", gpu=limits), nodeName="gpu-0"))

    assert not decision.allowed
    [message] = gpu008(decision)
    assert message.startswith("GPU008: GPU cards are placed and accounted by the scheduler extender, never chosen by the pod: ")
    assert "spec.nodeName is 'gpu-0' while container \"trainer\" asks for " in message
    assert "remove nodeName and pick the node with a nodeSelector (kubernetes.io/hostname) instead" in message


@pytest.mark.parametrize(
    "where",
    ["requests-only", "init", "sidecar"],
)
def test_node_name_is_refused_whichever_container_or_section_asks(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, where: str
) -> None:
    if where == "requests-only":
        obj = pod(container(requests=GPU_MEM), nodeName="gpu-0")
        label = 'container "main"'
    else:
        init = container("setup", gpu=GPU_MEM, **({"restartPolicy": "Always"} if where == "sidecar" else {}))
        obj = pod(container(), init=[init], nodeName="gpu-0")
        label = 'init container "setup"'

    decision = evaluate(obj)

    assert any(f"{label} asks for aliyun.com/gpu-mem" in m and "spec.nodeName" in m for m in gpu008(decision))


@pytest.mark.parametrize(
    "limits",
    [
        pytest.param(None, id="no-gpu"),
        pytest.param({"cpu": "2", "memory": "1Gi"}, id="cpu-only"),
        # Whole cards of the NVIDIA device plugin are handed out by the kubelet's device manager on
        # the node itself, which refuses a pod the node has no free card for.
        pytest.param({"nvidia.com/gpu": 1}, id="nvidia-gpu"),
    ],
)
def test_node_name_is_fine_for_pods_asking_for_no_extender_resource(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, limits: dict[str, Any] | None
) -> None:
    decision = evaluate(pod(container(gpu=limits), nodeName="gpu-0"))

    assert decision.allowed, decision.denial_message
    assert result(decision, "GPU008") is model.Result.PASS


def test_an_empty_node_name_is_no_node_name(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf
) -> None:
    decision = evaluate(pod(container(gpu=GPU_MEM), nodeName=""))

    assert result(decision, "GPU008") is model.Result.PASS


@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet", "Job", "CronJob", "ReplicaSet"])
def test_a_workload_template_with_node_name_is_refused_when_applied(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate, kind: str
) -> None:
    decision = evaluate(workload(kind, pod(container(gpu=GPU_MEM), nodeName="gpu-0", **CGPU)))

    assert not decision.allowed
    [message] = gpu008(decision)
    assert ": the pod template: spec.nodeName is 'gpu-0' while container \"main\" asks for aliyun.com/gpu-mem" in message


def test_a_workload_template_with_node_name_but_no_gpu_passes(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate, result: ResultOf
) -> None:
    decision = evaluate(workload("Deployment", pod(container(), nodeName="edge-3")))

    assert decision.allowed and result(decision, "GPU008") is model.Result.PASS


# --- (b) allocation annotations on create ------------------------------------------------------------


@pytest.mark.parametrize("key", gpu.ALLOCATION_ANNOTATIONS)
@pytest.mark.parametrize("limits", [None, GPU_MEM], ids=["cpu-pod", "gpu-mem-pod"])
def test_an_allocation_annotation_on_create_is_refused_on_any_pod(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, key: str, limits: dict[str, int] | None
) -> None:
    # The extender's accounting reads them from every pod without looking at its request, so a
    # CPU pod with a forged allocation would hold a card away from everyone else.
    decision = evaluate(pod(container(gpu=limits), annotations={key: "0"}, **CGPU))

    assert not decision.allowed
    [message] = gpu008(decision)
    assert f": annotation {key} is set by the pod; only the scheduler extender writes the allocation annotations" in message
    assert message.endswith("remove it")


def test_every_forged_key_is_named_once(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(pod(container(gpu=GPU_MEM), annotations=dict(BOUND), **CGPU))

    [message] = gpu008(decision)
    assert f"annotation {', '.join(gpu.ALLOCATION_ANNOTATIONS)} is set by the pod" in message
    assert message.endswith("remove them")


def test_a_forged_annotation_in_a_cronjob_template_is_refused(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(workload("CronJob", pod(container(gpu=GPU_MEM), annotations={"ALIYUN_COM_GPU_MEM_IDX": "3"}, **CGPU)))

    assert not decision.allowed
    assert "the pod template: annotation ALIYUN_COM_GPU_MEM_IDX is set by the pod" in gpu008(decision)[0]


@pytest.mark.parametrize(
    "annotations",
    [
        {"gpu-admission.io/gpu-model": "Tesla-T4"},
        {"team": "ml", "prometheus.io/scrape": "true"},
        # Another spelling is read by nobody: annotation keys are case-sensitive and every reader
        # looks them up exactly (see the test below); the variable of the same name in a
        # container's env is GPU001's.
        {"aliyun_com_gpu_mem_idx": "0", "ALIYUN_COM_GPU_MEM_ASSIGN_TIME": "1"},
    ],
)
def test_other_annotations_pass(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, annotations: dict[str, str]
) -> None:
    decision = evaluate(pod(container(gpu=GPU_MEM), annotations=annotations, **CGPU))

    assert result(decision, "GPU008") is model.Result.PASS


def test_a_differently_spelled_key_holds_no_card_in_the_accounting() -> None:
    forged: dict[str, Any] = {
        "metadata": {"name": "p", "annotations": {"aliyun_com_gpu_mem_idx": "0", "aliyun_com_gpu_mem_pod": "9"}},
        "spec": {"nodeName": "gpu-0"},
    }
    assert allocation_.pod_allocation(forged, now=0.0) is None
    real = copy.deepcopy(forged)
    real["metadata"]["annotations"] = {"ALIYUN_COM_GPU_MEM_IDX": "0", "ALIYUN_COM_GPU_MEM_POD": "9"}
    assert allocation_.pod_allocation(real, now=0.0) is not None


def test_the_policy_guards_every_annotation_the_extender_writes() -> None:
    allocation = allocation_.Allocation(uid="u", namespace="n", name="p", node="gpu-0", cards=(1,), memory_gib=4, assumed_at=1.0)
    written = allocation_.bind_annotations(allocation, card_memory_gib=15)
    assert set(written) == set(gpu.ALLOCATION_ANNOTATIONS)
    assert cardrequest.pod_request(
        {"spec": {"containers": [{"resources": {"limits": dict.fromkeys(gpu.EXTENDER_MANAGED, 1)}}]}}
    ).problem


# --- (c) pod UPDATE ----------------------------------------------------------------------------------


def update(evaluate: Any, old: dict[str, Any], new: dict[str, Any], **kwargs: Any) -> model.Decision:
    decision: model.Decision = evaluate(new, operation="UPDATE", old=old, **kwargs)
    return decision


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            lambda a: a.update({"gpu-admission.io/allocation": ALLOCATION.replace('"cards":[1]', '"cards":[0]')}),
            "changes gpu-admission.io/allocation",
        ),
        (lambda a: a.update({"ALIYUN_COM_GPU_MEM_IDX": "0"}), "changes ALIYUN_COM_GPU_MEM_IDX"),
        (lambda a: a.update({"ALIYUN_COM_GPU_MEM_POD": "1"}), "changes ALIYUN_COM_GPU_MEM_POD"),
        (lambda a: a.pop("gpu-admission.io/allocation"), "removes gpu-admission.io/allocation"),
        (lambda a: a.pop("ALIYUN_COM_GPU_MEM_DEV"), "removes ALIYUN_COM_GPU_MEM_DEV"),
        (
            lambda a: a.update({"ALIYUN_COM_GPU_MEM_ASSIGNED": "true", "ALIYUN_COM_GPU_MEM_IDX": "2"}),
            "changes ALIYUN_COM_GPU_MEM_IDX, changes ALIYUN_COM_GPU_MEM_ASSIGNED",
        ),
    ],
    ids=["move-allocation", "move-card", "shrink", "drop-allocation", "drop-dev", "assign-and-move"],
)
def test_changing_a_bound_pods_allocation_annotations_is_refused(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, change: Callable[[dict[str, Any]], object], said: str
) -> None:
    old = bound_pod(pod, container)
    new = copy.deepcopy(old)
    change(new["metadata"]["annotations"])

    decision = update(evaluate, old, new)

    assert not decision.allowed and decision.patch == ()
    [message] = gpu008(decision)
    assert (
        f": the update {said}; a running pod's allocation annotations are written only by the scheduler extender's Binding"
        in message
    )
    assert message.endswith("leave them as they are")


@pytest.mark.parametrize("key", gpu.ALLOCATION_ANNOTATIONS)
def test_adding_an_allocation_annotation_to_a_running_pod_is_refused(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, key: str
) -> None:
    old = pod(container(gpu=GPU_MEM), nodeName="gpu-0", **CGPU)  # placed without the extender, say
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = {key: "0"}

    decision = update(evaluate, old, new)

    assert not decision.allowed
    assert f"the update adds {key};" in gpu008(decision)[0]


def test_a_forged_annotation_added_to_a_cpu_pod_is_refused_too(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    old = pod(container(), nodeName="cpu-0")
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = {"gpu-admission.io/allocation": ALLOCATION}

    assert not update(evaluate, old, new).allowed


def test_the_device_plugins_assignment_passes(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf
) -> None:
    # gpushare-device-plugin's patchPodAnnotationSpecAssigned: ASSIGNED=true and ASSUME_TIME=now.
    old = bound_pod(pod, container)
    new = bound_pod(pod, container, ALIYUN_COM_GPU_MEM_ASSIGNED="true", ALIYUN_COM_GPU_MEM_ASSUME_TIME="1767225601234567890")

    decision = update(evaluate, old, new)

    assert decision.allowed and result(decision, "GPU008") is model.Result.PASS
    only_flag = bound_pod(pod, container, ALIYUN_COM_GPU_MEM_ASSIGNED="true")
    assert update(evaluate, old, only_flag).allowed


@pytest.mark.parametrize(
    "annotations",
    [
        {"ALIYUN_COM_GPU_MEM_ASSIGNED": "false"},  # true -> false: not what the device plugin does
        {"ALIYUN_COM_GPU_MEM_ASSIGNED": "True"},
        {"ALIYUN_COM_GPU_MEM_ASSUME_TIME": "1"},  # the time alone
        {"ALIYUN_COM_GPU_MEM_ASSIGNED": "true", "ALIYUN_COM_GPU_MEM_ASSUME_TIME": "soon"},
        {"ALIYUN_COM_GPU_MEM_ASSIGNED": "true", "ALIYUN_COM_GPU_MEM_ASSUME_TIME": "-1"},
    ],
    ids=["unassign", "capital-true", "time-only", "time-not-a-number", "time-negative"],
)
def test_anything_but_that_transition_is_refused(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, annotations: dict[str, str]
) -> None:
    before = {"ALIYUN_COM_GPU_MEM_ASSIGNED": "true"} if annotations.get("ALIYUN_COM_GPU_MEM_ASSIGNED") == "false" else {}
    old = bound_pod(pod, container, **before)
    new = bound_pod(pod, container, **{**before, **annotations})

    assert not update(evaluate, old, new).allowed


def test_a_removed_assigned_flag_cannot_be_turned_into_the_transition(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    old = bound_pod(pod, container)
    del old["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_ASSIGNED"]
    new = bound_pod(pod, container, ALIYUN_COM_GPU_MEM_ASSIGNED="true")

    assert "the update adds ALIYUN_COM_GPU_MEM_ASSIGNED" in gpu008(update(evaluate, old, new))[0]


@pytest.mark.parametrize(
    "edit",
    [
        lambda p: p["metadata"].update({"labels": {"team": "b"}}),
        lambda p: p["metadata"]["annotations"].update({"note": "checkpoint at step 9000"}),
        lambda p: p["metadata"].update({"finalizers": ["example.com/keep"]}),
        lambda p: p["spec"]["containers"][0].update({"image": "registry.example/app:2"}),
    ],
    ids=["label", "other-annotation", "finalizer", "image"],
)
def test_ordinary_updates_of_a_bound_gpu_pod_pass_and_nothing_else_judges_them(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, edit: Callable[[dict[str, Any]], object]
) -> None:
    old = bound_pod(pod, container)
    new = copy.deepcopy(old)
    edit(new)

    decision = update(evaluate, old, new)

    assert decision.allowed and decision.patch == () and decision.warnings == ()
    assert [(r.policy, r.result) for r in decision.results] == [
        ("GPU008", model.Result.PASS),
        ("GPU010", model.Result.PASS),
        ("GPU013", model.Result.PASS),
    ]


def test_an_update_of_a_pod_that_breaks_a_create_rule_is_not_refused_for_it(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    # Stored before the rule (nodeName on a gpu-mem pod, a custom scheduler): a relabel must pass.
    old = pod(container(gpu=GPU_MEM), nodeName="gpu-0", schedulerName="tenant-scheduler", **CGPU)
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"x": "y"}

    assert update(evaluate, old, new).allowed


def test_the_ephemeral_containers_subresource_is_not_judged_for_annotations(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf
) -> None:
    old = bound_pod(pod, container)
    new = copy.deepcopy(old)
    new["spec"]["ephemeralContainers"] = [{"name": "debug", "image": "busybox"}]
    new["metadata"]["annotations"]["ALIYUN_COM_GPU_MEM_IDX"] = "3"  # the subresource ignores metadata

    decision = update(evaluate, old, new, subresource="ephemeralcontainers")

    assert result(decision, "GPU008") is model.Result.PASS


def test_a_workload_update_that_adds_a_forged_template_annotation_is_refused(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate
) -> None:
    old = workload("Deployment", pod(container(gpu=GPU_MEM), **CGPU))
    new = workload("Deployment", pod(container(gpu=GPU_MEM), annotations={"gpu-admission.io/allocation": ALLOCATION}, **CGPU))

    assert "the pod template: annotation gpu-admission.io/allocation" in gpu008(update(evaluate, old, new))[0]


@pytest.mark.parametrize("old", [None, {"kind": "Pod"}, {"kind": "Pod", "metadata": {"annotations": "x"}}, "junk"])
def test_a_missing_or_malformed_old_object_reads_as_no_annotations(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, old: Any
) -> None:
    new = bound_pod(pod, container)

    decision = update(evaluate, old, new)

    assert not decision.allowed
    assert "the update adds ALIYUN_COM_GPU_MEM_IDX" in gpu008(decision)[0]
    assert update(evaluate, old, pod(container(), nodeName="cpu-0")).allowed


# --- (d) spec.schedulerName --------------------------------------------------------------------------


@pytest.mark.parametrize("scheduler", ["tenant-scheduler", "volcano", "Default-Scheduler", 7, ["default-scheduler"]])
def test_a_scheduler_that_does_not_call_the_extender_is_refused(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, scheduler: object
) -> None:
    decision = evaluate(pod(container(gpu=GPU_MEM), schedulerName=scheduler, **CGPU))

    assert not decision.allowed
    [message] = gpu008(decision)
    assert f'spec.schedulerName is {scheduler!r} while container "main" asks for aliyun.com/gpu-mem' in message
    assert "not a scheduler that calls the extender (default-scheduler)" in message
    assert "extenderSchedulers" in message


@pytest.mark.parametrize("spec", [{}, {"schedulerName": ""}, {"schedulerName": "default-scheduler"}])
def test_the_default_scheduler_calls_the_extender(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, spec: dict[str, str]
) -> None:
    decision = evaluate(pod(container(gpu=GPU_MEM), **spec, **CGPU))

    assert decision.allowed and result(decision, "GPU008") is model.Result.PASS


@pytest.mark.parametrize("limits", [None, {"nvidia.com/gpu": 1}], ids=["cpu", "nvidia-gpu"])
def test_other_pods_may_use_any_scheduler(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, limits: dict[str, int] | None
) -> None:
    decision = evaluate(pod(container(gpu=limits), schedulerName="volcano"))

    assert result(decision, "GPU008") is model.Result.PASS


def test_configured_extender_schedulers_are_accepted_and_replace_the_default(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    config = {"extenderSchedulers": ["gpu-b"]}

    assert evaluate(pod(container(gpu=GPU_MEM), schedulerName="gpu-b", **CGPU), config=config).allowed
    refused = evaluate(pod(container(gpu=GPU_MEM), schedulerName="default-scheduler", **CGPU), config=config)
    assert "not a scheduler that calls the extender (gpu-b)" in gpu008(refused)[0]


def test_the_gpu105_scheduler_always_counts_and_its_patch_is_judged(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched
) -> None:
    config = {"gpuSchedulerName": "gpu-admission-scheduler", "extenderSchedulers": []}
    obj = pod(container(gpu=GPU_MEM), schedulerName="default-scheduler", **CGPU)

    decision = evaluate(obj, config=config)  # GPU105 moves it to the GPU scheduler first

    assert decision.allowed
    assert decision.patch == ({"op": "add", "path": "/spec/schedulerName", "value": "gpu-admission-scheduler"},)
    assert evaluate(patched(obj, decision.patch), config=config).patch == ()
    kept = evaluate(pod(container(gpu=GPU_MEM), schedulerName="volcano", **CGPU), config=config)
    assert "(gpu-admission-scheduler)" in gpu008(kept)[0]


def test_a_workload_template_with_another_scheduler_is_refused(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(
        workload(
            "Job",
            pod(container(gpu={"aliyun.com/gpu": 1}), schedulerName="batch", nodeSelector={"ack.node.gpu.schedule": "topology"}),
        )
    )

    assert "the pod template: spec.schedulerName is 'batch'" in gpu008(decision)[0]


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("default-scheduler", "extenderSchedulers: must be a list of non-empty strings"),
        ([""], "extenderSchedulers: must be a list of non-empty strings"),
        ([3], "extenderSchedulers: must be a list of non-empty strings"),
    ],
)
def test_a_bad_extender_schedulers_setting_is_refused_naming_the_field(value: object, error: str) -> None:
    with pytest.raises(settings.InvalidSettings, match=error):
        settings.from_mapping({"extenderSchedulers": value})


def test_extender_schedulers_default_and_parse() -> None:
    assert settings.Settings().extender_schedulers == {"default-scheduler"}
    parsed = settings.from_mapping({"extenderSchedulers": [" gpu-a ", "gpu-a", "gpu-b"], "gpuSchedulerName": "gpu-c"})
    assert parsed.extender_scheduler_names == ("gpu-a", "gpu-b")
    assert parsed.extender_schedulers == {"gpu-a", "gpu-b", "gpu-c"}


# --- actions, namespaces, audit ----------------------------------------------------------------------


def test_a_namespace_override_can_switch_it_off_where_an_admin_places_pods_by_hand(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf
) -> None:
    config = {"namespaceOverrides": [{"name": "ops", "namespaces": ["ops"], "policies": {"GPU008": {"action": "off"}}}]}
    obj = pod(container(gpu=GPU_MEM), nodeName="gpu-0", **CGPU)

    assert result(evaluate(obj, config=config, namespace="ops"), "GPU008") is model.Result.SKIP
    assert not evaluate(obj, config=config, namespace="team-a").allowed


def test_warn_mode_admits_with_the_message_as_a_warning(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(
        pod(container(gpu=GPU_MEM), nodeName="gpu-0", **CGPU), config={"policies": {"GPU008": {"action": "warn"}}}
    )

    assert decision.allowed
    assert any(w.startswith("GPU008: ") and "spec.nodeName" in w for w in decision.warnings)


def test_the_audit_leaves_it_out_because_a_bound_pod_carries_node_name_and_annotations() -> None:
    ids = [p.id for p in scan.VALIDATORS]
    assert "GPU008" not in ids and "GPU001" in ids
    [policy] = [p for p in engine.POLICIES if p.id == "GPU008"]
    assert policy.pod_updates and not policy.stored_objects
    assert scan.audit_settings(settings.Settings()).action("GPU008") is model.Action.OFF
