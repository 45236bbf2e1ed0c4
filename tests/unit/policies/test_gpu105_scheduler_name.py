"""GPU105: pods using extender-managed GPU resources go to the GPU scheduler, when configured."""

from __future__ import annotations

from typing import Any

import pytest

from policies import model
from tests.unit.policies.conftest import ContainerFactory, Evaluate, Patched, PodFactory, ResultOf, WorkloadFactory

CONFIG = {"gpuSchedulerName": "gpu-scheduler"}


def test_not_configured_means_skipped(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf) -> None:
    decision = evaluate(pod(container(gpu={"aliyun.com/gpu": 1}), nodeSelector={"ack.node.gpu.schedule": "topology"}))

    assert result(decision, "GPU105") is model.Result.SKIP
    assert decision.patch == ()


@pytest.mark.parametrize(
    ("limits", "mode"),
    [
        ({"aliyun.com/gpu-mem": 2}, "cgpu"),
        ({"aliyun.com/gpu-mem": 2, "aliyun.com/gpu-core.percentage": 20}, "core_mem"),
        ({"aliyun.com/gpu": 1}, "topology"),
    ],
)
@pytest.mark.parametrize("scheduler", [None, "", "default-scheduler"])
def test_extender_resources_get_the_gpu_scheduler(
    pod: PodFactory,
    container: ContainerFactory,
    evaluate: Evaluate,
    patched: Patched,
    limits: dict[str, int],
    mode: str,
    scheduler: str | None,
) -> None:
    # The apiserver defaults schedulerName to default-scheduler before admission, so that
    # value must be replaced for the policy to ever take effect.
    spec: dict[str, Any] = {"nodeSelector": {"ack.node.gpu.schedule": mode}}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    obj = pod(container(gpu=limits), **spec)

    decision = evaluate(obj, config=CONFIG)

    assert decision.patch == ({"op": "add", "path": "/spec/schedulerName", "value": "gpu-scheduler"},)
    again = evaluate(patched(obj, decision.patch), config=CONFIG)
    assert again.patch == ()


def test_a_custom_scheduler_the_user_chose_is_kept(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    obj = pod(container(gpu={"aliyun.com/gpu": 1}), nodeSelector={"ack.node.gpu.schedule": "topology"}, schedulerName="volcano")

    # An admin lists the scheduler as one calling the extender, or GPU008 refuses the pod.
    decision = evaluate(obj, config={**CONFIG, "extenderSchedulers": ["default-scheduler", "volcano"]})

    assert decision.allowed and decision.patch == ()
    assert not evaluate(obj, config=CONFIG).allowed


def test_whole_card_pods_keep_the_default_scheduler(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(pod(container(gpu={"nvidia.com/gpu": 1}), schedulerName="default-scheduler"), config=CONFIG)

    assert decision.patch == ()


def test_job_template_gets_the_scheduler_after_the_mode_selector(
    pod: PodFactory, container: ContainerFactory, workload: WorkloadFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(workload("Job", pod(container(gpu={"aliyun.com/gpu-mem": 1}))), config=CONFIG)

    assert decision.patch == (
        {"op": "add", "path": "/spec/template/spec/nodeSelector", "value": {"ack.node.gpu.schedule": "cgpu"}},
        {"op": "add", "path": "/spec/template/spec/schedulerName", "value": "gpu-scheduler"},
    )
