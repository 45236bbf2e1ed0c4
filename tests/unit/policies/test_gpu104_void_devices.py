"""GPU104: containers that request no GPU get NVIDIA_VISIBLE_DEVICES=void."""

from __future__ import annotations

from typing import Any

from tests.unit.policies.conftest import (
    ContainerFactory,
    Evaluate,
    Patched,
    PodFactory,
    WorkloadFactory,
    assert_second_pass_is_empty,
)

VOID_ENV = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}


def test_container_without_env_gets_an_env_list_with_void(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched
) -> None:
    obj = pod(container())

    decision = evaluate(obj)

    assert decision.patch == ({"op": "add", "path": "/spec/containers/0/env", "value": [VOID_ENV]},)
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


def test_container_with_env_gets_void_appended(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched
) -> None:
    obj = pod(container(env=[{"name": "LOG_LEVEL", "value": "info"}]))

    decision = evaluate(obj)

    assert decision.patch == ({"op": "add", "path": "/spec/containers/0/env/-", "value": VOID_ENV},)
    assert patched(obj, decision.patch)["spec"]["containers"][0]["env"] == [
        {"name": "LOG_LEVEL", "value": "info"},
        VOID_ENV,
    ]
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


def test_null_env_is_replaced_by_a_list(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched
) -> None:
    main = container()
    main["env"] = None  # as written `env:` with nothing after it (seed 004_79385826ac27146d.txt)
    obj = pod(main)

    decision = evaluate(obj)

    assert decision.patch == ({"op": "add", "path": "/spec/containers/0/env", "value": [VOID_ENV]},)
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


def test_only_the_containers_without_gpus_get_void_init_containers_included(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched
) -> None:
    obj = pod(
        container("trainer", gpu={"nvidia.com/gpu": 1}),
        container("logger", env=[]),
        init=[container("fetch")],
    )

    decision = evaluate(obj)

    assert decision.patch == (
        {"op": "add", "path": "/spec/initContainers/0/env", "value": [VOID_ENV]},
        {"op": "add", "path": "/spec/containers/1/env/-", "value": VOID_ENV},
    )
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


def test_a_value_the_user_set_is_not_touched(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(pod(container(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}])))

    assert decision.allowed
    assert decision.patch == ()


def test_only_the_new_ephemeral_container_gets_void(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched
) -> None:
    old = pod(container(env=[VOID_ENV]), ephemeral=[container("first")])
    new = pod(container(env=[VOID_ENV]), ephemeral=[container("first"), container("debug")])
    kwargs: dict[str, Any] = {"operation": "UPDATE", "subresource": "ephemeralcontainers", "old": old}

    decision = evaluate(new, **kwargs)

    assert decision.patch == ({"op": "add", "path": "/spec/ephemeralContainers/1/env", "value": [VOID_ENV]},)
    assert_second_pass_is_empty(evaluate, patched, new, decision, **kwargs)


def test_ephemeral_subresource_does_not_touch_the_rest_of_the_pod(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    # Only ephemeralContainers may change through the subresource; a pod-level addition
    # (GPU101's nodeSelector) would make the apiserver refuse the update.
    old = pod(container(gpu={"aliyun.com/gpu-mem": 2}))
    new = pod(container(gpu={"aliyun.com/gpu-mem": 2}), ephemeral=[container("debug")])

    decision = evaluate(new, operation="UPDATE", subresource="ephemeralcontainers", old=old)

    assert [op["path"] for op in decision.patch] == ["/spec/ephemeralContainers/0/env"]


def test_statefulset_template_containers_get_void(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(workload("StatefulSet", pod(container())))

    assert decision.patch == ({"op": "add", "path": "/spec/template/spec/containers/0/env", "value": [VOID_ENV]},)


def test_containers_asking_for_other_nvidia_device_plugin_resources_are_left_alone(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, patched: Patched
) -> None:
    # MIG slices and shared cards come from NVIDIA's device plugin, which sets the container's
    # NVIDIA_VISIBLE_DEVICES; a pod-level `void` would override it and leave the container blind.
    obj = pod(
        container("mig", gpu={"nvidia.com/mig-1g.5gb": 1}),
        container("shared", gpu={"nvidia.com/gpu.shared": 1}, env=[]),
        container("slice", gpu={"nvidia.com/mig-2g.10gb": 1}, requests={"nvidia.com/mig-2g.10gb": "1"}),
        container("sidecar-log", env=[{"name": "LOG_LEVEL", "value": "info"}]),
        init=[container("fetch")],
    )

    decision = evaluate(obj)

    assert decision.patch == (
        {"op": "add", "path": "/spec/initContainers/0/env", "value": [VOID_ENV]},
        {"op": "add", "path": "/spec/containers/3/env/-", "value": VOID_ENV},
    )
    assert_second_pass_is_empty(evaluate, patched, obj, decision)


def test_a_resource_outside_nvidias_domain_is_no_gpu_request(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(pod(container(gpu={"example.com/nvidia.com-gpu": 1, "cpu": "1"})))

    assert decision.patch == ({"op": "add", "path": "/spec/containers/0/env", "value": [VOID_ENV]},)
