"""`policies.gpu.dra` reads real ResourceSlices and ResourceClaims: NVIDIA's driver's shapes and
Kubernetes' own round-trip fixtures (tests/data/dra, each file names its source)."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
import yaml

from policies.gpu import dra

DATA = pathlib.Path(__file__).parents[2] / "data" / "dra"


def _objects(name: str) -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all((DATA / name).read_text()) if doc}


NVIDIA = _objects("nvidia-gpu.yaml")
K8S_CLAIM = _objects("k8s-resourceclaim-v1.yaml")["ResourceClaim"]
K8S_SLICE = _objects("k8s-resourceslice-v1.yaml")["ResourceSlice"]
CARD0 = "GPU-4404041a-04cf-1ccf-9e70-f139a9b1e23c"
CARD1 = "GPU-8b1c4f3a-7d2e-4c1b-9f0a-3e5d6c7b8a91"


def test_an_nvidia_slice_names_each_device_and_the_card_it_occupies() -> None:
    found = {d.name: d for d in dra.slice_devices(NVIDIA["ResourceSlice"])}
    assert found["gpu-0"] == dra.Device(
        driver="gpu.nvidia.com", pool="worker-gpu-01", name="gpu-0", node="worker-gpu-01", uuid=CARD0, card_uuid=CARD0
    )
    assert found["gpu-1"].card_uuid == CARD1
    # A MIG device occupies the card it is carved from (its parentUUID), not a card of its own.
    assert found["gpu-1-mig-9-4-4"].uuid.startswith("MIG-")
    assert found["gpu-1-mig-9-4-4"].card_uuid == CARD1


def test_an_allocated_nvidia_claim_holds_its_card_on_its_node() -> None:
    held = dra.holds([NVIDIA["ResourceSlice"]], [NVIDIA["ResourceClaim"]])
    assert list(held) == ["worker-gpu-01"]
    (claim,) = held["worker-gpu-01"][CARD0]
    assert (claim.claim_key, claim.device, claim.request, claim.shared) == ("gpu-test3/single-gpu", "gpu-0", "gpu", False)
    assert CARD1 not in held["worker-gpu-01"]


def test_the_kubernetes_claim_fixture_decodes_every_result_field() -> None:
    (result,) = dra.claim_results(K8S_CLAIM)
    assert result.key == ("driverValue", "poolValue", "deviceValue")
    assert result.admin_access and result.shared
    assert result.consumed == (("consumedCapacityKey", "0"),)
    assert result.claim_key == "namespaceValue/nameValue"


def test_admin_access_holds_no_card() -> None:
    slice_ = {
        "spec": {
            "driver": "driverValue",
            "pool": {"name": "poolValue"},
            "nodeName": "n",
            "devices": [{"name": "deviceValue", "attributes": {"uuid": {"string": "GPU-x"}}}],
        }
    }
    assert dra.holds([slice_], [K8S_CLAIM]) == {}
    assert dra.unmatched([slice_], [K8S_CLAIM]) == ()


def test_the_kubernetes_slice_fixture_has_a_device_without_a_uuid() -> None:
    (device,) = dra.slice_devices(K8S_SLICE)
    assert (device.driver, device.pool, device.name, device.node, device.card_uuid) == (
        "driverValue",
        "nameValue",
        "nameValue",
        "nodeNameValue",
        "",
    )


def test_a_qualified_attribute_name_reads_like_a_bare_one() -> None:
    device = {"name": "gpu-0", "attributes": {"gpu.nvidia.com/uuid": {"string": "GPU-q"}}}
    slice_ = {"spec": {"driver": "gpu.nvidia.com", "pool": {"name": "n"}, "nodeName": "n", "devices": [device]}}
    assert dra.slice_devices(slice_)[0].card_uuid == "GPU-q"


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    def slice_(generation: int, uuid: str) -> dict[str, Any]:
        return {
            "metadata": {"name": f"s{generation}"},
            "spec": {
                "driver": "d",
                "pool": {"name": "p", "generation": generation},
                "nodeName": "n",
                "devices": [{"name": "dev", "attributes": {"uuid": {"string": uuid}}}],
            },
        }

    assert dra.devices([slice_(1, "GPU-old"), slice_(2, "GPU-new")])[("d", "p", "dev")].uuid == "GPU-new"


def test_a_claim_naming_an_unpublished_device_is_unmatched_not_a_crash() -> None:
    assert dra.holds([], [NVIDIA["ResourceClaim"]]) == {}
    assert [h.device for h in dra.unmatched([], [NVIDIA["ResourceClaim"]])] == ["gpu-0"]


@pytest.mark.parametrize(
    "broken",
    [{}, {"spec": None}, {"spec": {"devices": "x"}}, {"status": {"allocation": {"devices": {"results": [1, None, {}]}}}}],
)
def test_broken_objects_read_as_holding_nothing(broken: dict[str, Any]) -> None:
    assert dra.slice_devices(broken) == ()
    assert dra.claim_results(broken) == ()
    assert dra.requests(dra.claim_spec(broken)) == ()


def test_requests_read_exactly_and_every_first_available_alternative() -> None:
    found = dra.requests(dra.claim_spec(K8S_CLAIM))
    assert [(r.name, r.class_name, r.selectors, r.admin_access) for r in found] == [
        ("nameValue", "deviceClassNameValue", ("expressionValue",), True),
        ("nameValue/nameValue", "deviceClassNameValue", ("expressionValue",), False),
    ]
    template = {"kind": "ResourceClaimTemplate", "spec": {"spec": NVIDIA["ResourceClaim"]["spec"]}}
    assert [r.class_name for r in dra.requests(dra.claim_spec(template))] == ["gpu.nvidia.com"]


def test_pod_claims_by_name_and_by_template() -> None:
    spec = {"resourceClaims": [{"name": "a", "resourceClaimName": "single-gpu"}, {"name": "b", "resourceClaimTemplateName": "t"}]}
    assert dra.pod_claims(spec) == (dra.PodClaim(name="a", claim_name="single-gpu"), dra.PodClaim(name="b", template_name="t"))


@pytest.mark.parametrize(
    ("expression", "reaches"),
    [
        ("device.driver == 'cpu.example.com'", False),
        ("device.attributes['cpu.example.com'].cores >= 4", False),
        ("device.driver == 'gpu.nvidia.com'", True),
        ('device.driver == "GPU.NVIDIA.COM"', True),
        ("device.attributes['gpu.nvidia.com'].type == 'gpu'", True),
        ("device.driver.startsWith('gpu.')", True),
        ("device.driver == 'g' + 'pu.nv' + 'idia.com'", True),
        ("device.attributes.exists(d, true)", True),
        ("device.driver in ['x', 'y']", True),
    ],
)
def test_a_selector_that_may_reach_a_gpu_driver_is_read_as_reaching_it(expression: str, reaches: bool) -> None:
    assert dra.selector_reaches(expression, drivers=["gpu.nvidia.com"]) is reaches


def test_taint_rules_are_planned_per_device_and_removed_when_no_longer_wanted() -> None:
    (gpu0, *_) = dra.slice_devices(NVIDIA["ResourceSlice"])
    rule = dra.taint_rule(gpu0, version="v1alpha3")
    assert rule["apiVersion"] == "resource.k8s.io/v1alpha3"
    assert rule["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": "worker-gpu-01", "device": "gpu-0"}
    assert rule["spec"]["taint"]["effect"] == "NoSchedule"
    assert dra.rule_device(rule) == gpu0.key
    assert dra.plan_rules([gpu0], []) == ((gpu0,), ())
    assert dra.plan_rules([gpu0], [rule]) == ((), ())
    foreign = {"metadata": {"name": "theirs"}, "spec": rule["spec"]}
    assert dra.plan_rules([], [rule, foreign]) == ((), (rule["metadata"]["name"],))
