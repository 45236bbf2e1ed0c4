"""The example manifests of the seeds are all admitted, with exactly the expected additions."""

from __future__ import annotations

import pytest

from policies.trustzone import DEFAULT_ZONE
from tests.unit.policies.conftest import Evaluate, ManifestLoader, Patched

VOID_ENV = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}

EXPECTED_PATCHES = {
    # Whole cards on a chosen card model: nothing to add.
    "seeds/tf-notebook.yaml": (),
    # No GPU: the image default cannot expose the node's cards.
    "seeds/not-in-gpu-node.yaml": ({"op": "add", "path": "/spec/containers/0/env", "value": [VOID_ENV]},),
    # GPU memory on node pools the seed selects itself (share, cgpu): kept as written.
    "seeds/cgpu-test-no-isolation.yaml": (),
    "seeds/cgpu-test.yaml": (),
    # Whole card, default exclusive scheduling.
    "seeds/tensorflow-mnist.yaml": (),
}


@pytest.mark.parametrize("name", sorted(EXPECTED_PATCHES))
def test_seed_manifest_is_allowed_with_the_expected_patch(
    manifest: ManifestLoader, evaluate: Evaluate, patched: Patched, name: str
) -> None:
    obj = manifest(name)

    decision = evaluate(obj, namespace="default")

    assert decision.allowed, decision.denial_message
    assert decision.warnings == ()
    assert decision.patch == EXPECTED_PATCHES[name]
    assert evaluate(patched(obj, decision.patch), namespace="default").patch == ()


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("seeds/cgpu-test-no-isolation.yaml", "/spec/template/spec/schedulerName"),
        ("seeds/cgpu-test.yaml", "/spec/template/spec/schedulerName"),
    ],
)
def test_seed_gpu_sharing_statefulsets_go_to_the_gpu_scheduler_when_configured(
    manifest: ManifestLoader, evaluate: Evaluate, name: str, path: str
) -> None:
    decision = evaluate(manifest(name), namespace="default", config={"gpuSchedulerName": "gpu-scheduler"})

    assert decision.allowed
    assert decision.patch == ({"op": "add", "path": path, "value": "gpu-scheduler"},)


def test_seed_pod_kept_off_gpu_nodes_gains_no_second_copy_of_its_affinity(manifest: ManifestLoader, evaluate: Evaluate) -> None:
    decision = evaluate(
        manifest("seeds/not-in-gpu-node.yaml"),
        namespace="default",
        config={"keepNonGpuPodsOffGpuNodes": True},
    )

    # The seed's own nvidia_name DoesNotExist stays the only copy; the other GPU node labels join it
    # (a GPU node that only the GPU Operator, NFD or a cloud labelled has no nvidia_name).
    terms = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms"
    added = tuple(
        {"op": "add", "path": f"{terms}/0/matchExpressions/-", "value": dict(e)}
        for e in DEFAULT_ZONE.keep_off
        if e["key"] != "aliyun.accelerator/nvidia_name"
    )
    assert len(added) == len(DEFAULT_ZONE.keep_off) - 1
    assert decision.patch == added + EXPECTED_PATCHES["seeds/not-in-gpu-node.yaml"]


def test_seed_gpu_memory_statefulset_without_its_selector_is_pinned_to_cgpu(manifest: ManifestLoader, evaluate: Evaluate) -> None:
    obj = manifest("seeds/cgpu-test.yaml")
    del obj["spec"]["template"]["spec"]["nodeSelector"]

    decision = evaluate(obj, namespace="default")

    assert decision.patch == (
        {"op": "add", "path": "/spec/template/spec/nodeSelector", "value": {"ack.node.gpu.schedule": "cgpu"}},
    )
