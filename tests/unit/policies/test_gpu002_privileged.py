"""GPU002: no privileged container in a pod that uses GPUs."""

from __future__ import annotations

from policies import model

PREFIX = "GPU002: privileged containers are not allowed in pods that use GPUs: "


def test_privileged_container_requesting_a_gpu_is_denied(pod, container, evaluate):
    decision = evaluate(pod(container(gpu={"nvidia.com/gpu": 1}, privileged=True)))

    assert not decision.allowed
    assert decision.denial_message == PREFIX + 'container "main" is privileged'


def test_privileged_init_container_in_a_pod_pinned_to_a_card_model_is_denied(
    pod, container, evaluate, violation_messages
):
    spec_pod = pod(
        container(),
        init=[container("setup", privileged=True)],
        nodeSelector={"aliyun.accelerator/nvidia_name": "Tesla-M40"},
    )

    decision = evaluate(spec_pod)

    assert not decision.allowed
    assert violation_messages(decision, "GPU002") == [PREFIX + 'init container "setup" is privileged']


def test_privileged_daemonset_preferring_gpu_nodes_is_denied(pod, container, workload, evaluate):
    preferring = pod(
        container(privileged=True),
        affinity={
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 1,
                        "preference": {
                            "matchExpressions": [
                                {"key": "ack.node.gpu.schedule", "operator": "Exists"}
                            ]
                        },
                    }
                ]
            }
        },
    )

    decision = evaluate(workload("DaemonSet", preferring))

    assert not decision.allowed
    assert decision.denial_message == PREFIX + 'container "main" is privileged'


def test_privileged_debug_container_added_to_a_gpu_pod_is_denied(pod, container, evaluate):
    old = pod(container(gpu={"aliyun.com/gpu-mem": 2}))
    new = pod(container(gpu={"aliyun.com/gpu-mem": 2}), ephemeral=[container("debug", privileged=True)])

    decision = evaluate(new, operation="UPDATE", subresource="ephemeralcontainers", old=old)

    assert not decision.allowed
    assert decision.denial_message == PREFIX + 'ephemeral container "debug" is privileged'


def test_unprivileged_gpu_pod_is_allowed(pod, container, evaluate, result):
    decision = evaluate(pod(container(gpu={"nvidia.com/gpu": 1}, privileged=False)))

    assert decision.allowed
    assert result(decision, "GPU002") is model.Result.PASS


def test_privileged_pod_without_gpus_is_allowed_and_kept_off_gpu_nodes(pod, container, evaluate):
    decision = evaluate(pod(container(privileged=True)))

    assert decision.allowed
    assert any(op["path"] == "/spec/affinity" for op in decision.patch)


def test_privileged_pod_that_avoids_gpu_nodes_is_allowed(pod, container, evaluate):
    avoiding = pod(
        container(privileged=True),
        nodeSelector={"kubernetes.io/os": "linux"},
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "aliyun.accelerator/nvidia_name", "operator": "DoesNotExist"}
                            ]
                        }
                    ]
                }
            }
        },
    )

    decision = evaluate(avoiding)

    assert decision.allowed
