"""podrequests: a pod's effective request, counted as kube-scheduler counts it (sidecars included)."""

from __future__ import annotations

from typing import Any

import pytest

from policies import gpu
from policies.gpu import podrequests

MEM = "aliyun.com/gpu-mem"


def box(name: str, amount: Any = None, *, sidecar: bool = False, resource: str = MEM, **extra: Any) -> dict[str, Any]:
    built: dict[str, Any] = {"name": name, "image": "img"}
    if amount is not None:
        built["resources"] = {"limits": {resource: amount}}
    if sidecar:
        built["restartPolicy"] = "Always"
    built.update(extra)
    return built


def spec(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (), **extra: Any) -> dict[str, Any]:
    return {"containers": list(containers), "initContainers": list(init), **extra}


def memory(pod_spec: dict[str, Any]) -> int:
    return gpu.pod_gpu_requests(pod_spec).get(MEM)


def test_regular_containers_add_up() -> None:
    assert memory(spec(box("a", 3), box("b", 2), box("c"))) == 5


def test_a_sidecar_adds_to_the_main_container() -> None:
    # The case of the issue: 4 GiB sidecar + 4 GiB main container is 8 GiB to Kubernetes.
    assert memory(spec(box("main", 4), init=(box("proxy", 4, sidecar=True),))) == 8


def test_an_ordinary_init_container_takes_the_maximum() -> None:
    assert memory(spec(box("main", 4), init=(box("setup", 6),))) == 6
    assert memory(spec(box("main", 4), init=(box("setup", 3),))) == 4


def test_an_init_container_counts_with_the_sidecars_started_before_it() -> None:
    # sidecar(2), init(5), sidecar(3), main(1): init needs 2 + 5 = 7; the running pod 2 + 3 + 1 = 6.
    pod_spec = spec(box("main", 1), init=(box("s1", 2, sidecar=True), box("init", 5), box("s2", 3, sidecar=True)))

    assert memory(pod_spec) == 7


def test_a_sidecar_started_after_an_init_container_does_not_add_to_it() -> None:
    # init(5) runs before the sidecar(4) starts: the pod needs max(5, 4 + 1) = 5, not 9.
    pod_spec = spec(box("main", 1), init=(box("init", 5), box("proxy", 4, sidecar=True)))

    assert memory(pod_spec) == 5


def test_several_init_containers_take_the_largest_need() -> None:
    pod_spec = spec(
        box("main", 2),
        init=(box("a", 3), box("s", 1, sidecar=True), box("b", 3), box("c", 1)),
    )

    # a: 3; b: 1 + 3 = 4; c: 1 + 1 = 2; running: 2 + 1 = 3.
    assert memory(pod_spec) == 4


def test_only_restart_policy_always_makes_a_sidecar() -> None:
    for policy in ("OnFailure", "Never", "always", None, 1):
        init = box("proxy", 4, restartPolicy=policy) if policy is not None else box("proxy", 4)
        assert memory(spec(box("main", 4), init=(init,))) == 4, policy


def test_requests_win_over_limits_as_after_apiserver_defaulting() -> None:
    main = {"name": "main", "resources": {"limits": {MEM: 4}, "requests": {MEM: "3"}}}
    only_requests = {"name": "b", "resources": {"requests": {MEM: 2}}}

    assert memory(spec(main, only_requests)) == 5


@pytest.mark.parametrize(("amount", "expect"), [("2000m", 2), ("+2", 2), ("1k", 1000), ("2e0", 2), ("0.002k", 2)])
def test_amounts_are_read_as_the_cluster_stores_them(amount: str, expect: int) -> None:
    assert memory(spec(box("main", amount))) == expect


def test_malformed_amounts_count_as_zero_and_are_reported() -> None:
    found = gpu.pod_gpu_requests(spec(box("main", "1500m"), box("b", 2), init=(box("x", "abc"),)))

    assert found.get(MEM) == 2
    assert found.malformed == (
        podrequests.Malformed(container='container "main"', resource=MEM, value="1500m"),
        podrequests.Malformed(container='init container "x"', resource=MEM, value="abc"),
    )


def test_overhead_is_added_as_kube_scheduler_adds_it() -> None:
    assert memory(spec(box("main", 2), overhead={MEM: "1", "cpu": "250m"})) == 3


def test_pod_level_resources_cannot_carry_gpus() -> None:
    # spec.resources (PodLevelResources) supports only cpu, memory and hugepages-*.
    assert memory(spec(box("main", 2), resources={"requests": {MEM: 8}, "limits": {MEM: 8}})) == 2


def test_ephemeral_containers_ask_for_nothing() -> None:
    pod_spec = spec(box("main", 2), ephemeralContainers=[box("debug", 4)])

    assert memory(pod_spec) == 2


def test_every_gpu_resource_is_counted_and_nothing_else() -> None:
    main = {"name": "main", "resources": {"limits": {"nvidia.com/mig-1g.5gb": 2, "cpu": "2", "nvidia.com/gpu": 1}}}
    side = box("side", 1, sidecar=True, resource="nvidia.com/mig-1g.5gb")

    assert gpu.pod_gpu_requests(spec(main, init=(side,))).amounts == {"nvidia.com/mig-1g.5gb": 3, "nvidia.com/gpu": 1}


@pytest.mark.parametrize(
    "pod_spec",
    [{}, {"containers": "x"}, {"containers": [None, 3, {"resources": []}]}, {"initContainers": [{"resources": {"limits": [1]}}]}],
)
def test_malformed_specs_ask_for_nothing_and_never_raise(pod_spec: dict[str, Any]) -> None:
    assert gpu.pod_gpu_requests(pod_spec).amounts == {}
