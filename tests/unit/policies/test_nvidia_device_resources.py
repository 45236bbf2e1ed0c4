"""Every nvidia.com/* resource is a GPU request: MIG slices and shared cards, across the policies.

NVIDIA's device plugin serves `nvidia.com/gpu`, MIG slices (`nvidia.com/mig-<profile>`) and shared
cards (`nvidia.com/gpu.shared`) on `default`-mode nodes. The policies that ask "does this pod (or
container) request a GPU" treat them alike: no `void` for them (GPU104), no privilege beside them
(GPU002), no keep-off-GPU-nodes affinity as if they were CPU pods (GPU103), and the mode they need is
`default` (GPU005, GPU101).
"""

from __future__ import annotations

import pytest

from policies import model
from tests.unit.policies.conftest import ContainerFactory, Evaluate, PodFactory, ResultOf

SLICES = ["nvidia.com/mig-1g.5gb", "nvidia.com/gpu.shared", "nvidia.com/mig-2g.10gb"]


@pytest.mark.parametrize("resource", SLICES)
def test_a_privileged_container_beside_a_mig_slice_is_refused(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, resource: str
) -> None:
    decision = evaluate(pod(container("app", gpu={resource: 1}), container("tool", privileged=True)))

    assert not decision.allowed
    assert "GPU002" in decision.denial_message


@pytest.mark.parametrize("resource", SLICES)
def test_an_ordinary_mig_pod_is_admitted_without_void_selector_or_affinity(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate, result: ResultOf, resource: str
) -> None:
    decision = evaluate(pod(container("app", gpu={resource: 1})))

    assert decision.allowed, decision.denial_message
    assert decision.patch == ()  # no void, no mode pin (default mode is also the unlabelled node), no affinity
    assert result(decision, "GPU002") is model.Result.PASS


def test_a_mig_pod_selecting_a_shared_mode_is_refused(pod: PodFactory, container: ContainerFactory, evaluate: Evaluate) -> None:
    decision = evaluate(pod(container(gpu={"nvidia.com/mig-1g.5gb": 1}), nodeSelector={"ack.node.gpu.schedule": "cgpu"}))

    assert not decision.allowed
    assert "GPU005" in decision.denial_message
    assert "nvidia.com/gpu" in decision.denial_message


def test_a_mig_pod_selecting_the_default_mode_is_admitted(
    pod: PodFactory, container: ContainerFactory, evaluate: Evaluate
) -> None:
    decision = evaluate(pod(container(gpu={"nvidia.com/mig-1g.5gb": 1}), nodeSelector={"ack.node.gpu.schedule": "default"}))

    assert decision.allowed, decision.denial_message
