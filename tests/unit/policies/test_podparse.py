"""`policies.gpu.podparse.PodParses`: one parse per pod object, the same answers as the functions it wraps.

Every answer is held equal to `cardrequest.pod_request`, `allocation.pod_allocation` and
`gpu.pod_gpu_requests` over generated pods, asked twice (the second time from the table); an entry
never answers for another object, equal or not, nor for an object that took a collected pod's `id`.
"""

from __future__ import annotations

import gc
from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st

from policies import gpu, podspec
from policies.gpu import allocation, cardrequest, podparse
from tests.unit.policies import test_properties

NOW = 1_800_000_000.0
SHARED = allocation.Allocation(
    uid="u1", namespace="ns", name="p1", node="gpu-0", cards=(1,), memory_gib=4, core_percent=30, assumed_at=NOW
)

annotation_sets: st.SearchStrategy[dict[str, str]] = st.one_of(
    st.just({}),
    st.just(allocation.bind_annotations(SHARED, card_memory_gib=15)),
    st.just({gpu.ALLOCATION_ANNOTATION: "{not json"}),
    st.just({gpu.GPUSHARE_MEM_IDX_ANNOTATION: "2", gpu.GPUSHARE_MEM_POD_ANNOTATION: "8"}),
)


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    """A generated pod spec, bound or not, with or without allocation annotations, any phase."""
    spec = dict(draw(test_properties.pod_spec))
    node = draw(st.sampled_from([None, "gpu-0", "gpu-1"]))
    if node is not None:
        spec["nodeName"] = node
    pod: dict[str, Any] = {
        "kind": "Pod",
        "metadata": {"uid": "u1", "namespace": "ns", "name": "p1", "annotations": draw(annotation_sets)},
        "spec": spec,
    }
    phase = draw(st.sampled_from([None, "Running", "Succeeded"]))
    if phase is not None:
        pod["status"] = {"phase": phase}
    unaliased: dict[str, Any] = test_properties.unaliased(pod)
    return unaliased


def _answers(pod: dict[str, Any], now: float) -> tuple[object, ...]:
    return (
        cardrequest.pod_request(pod),
        allocation.pod_allocation(pod, now=now),
        allocation.pod_allocation(pod, now=now, ttl=1.0),
        gpu.pod_gpu_requests(podspec.mapping(pod.get("spec"))),
    )


def _shared(parses: podparse.PodParses, pod: dict[str, Any], now: float) -> tuple[object, ...]:
    return (
        parses.request(pod),
        parses.allocation(pod, now=now),
        parses.allocation(pod, now=now, ttl=1.0),
        parses.gpu_requests(pod),
    )


@test_properties.PROPERTY_SETTINGS
@hypothesis.given(pod=pods(), now=st.sampled_from([NOW - 10.0, NOW + 60.0, NOW + 500.0]))
def test_generated_pods_get_the_functions_answers_first_and_from_the_table(pod: dict[str, Any], now: float) -> None:
    parses = podparse.PodParses()
    expected = _answers(pod, now)
    assert _shared(parses, pod, now) == expected
    assert parses.misses == 4 and parses.hits == 0
    assert _shared(parses, pod, now) == expected
    assert parses.hits == 4 and parses.misses == 4


def test_the_answers_are_the_ones_for_this_pod() -> None:
    bound: dict[str, Any] = {
        "metadata": {
            "uid": "u1",
            "namespace": "ns",
            "name": "p1",
            "annotations": allocation.bind_annotations(SHARED, card_memory_gib=15),
        },
        "spec": {"nodeName": "gpu-0", "containers": [{"name": "c", "resources": {"limits": {"aliyun.com/gpu-mem": "4"}}}]},
    }
    parses = podparse.PodParses()
    assert parses.allocation(bound, now=NOW) == allocation.Allocation(**{**SHARED.__dict__, "bound": True})
    assert parses.request(bound) == cardrequest.Request(memory_gib=4)
    assert parses.gpu_requests(bound).amounts == {"aliyun.com/gpu-mem": 4}
    # A later `now` past the TTL does not matter for a bound pod; a different `now` is its own entry.
    unbound = {**bound, "spec": {"containers": bound["spec"]["containers"]}}
    assert parses.allocation(unbound, now=NOW + 1.0) is not None
    assert parses.allocation(unbound, now=NOW + 10_000.0) is None  # expired: not the answer kept for NOW + 1


def test_an_equal_but_different_object_is_parsed_on_its_own() -> None:
    parses = podparse.PodParses()
    first = {"spec": {"containers": [{"name": "c", "resources": {"limits": {"aliyun.com/gpu-mem": "4"}}}]}}
    second = test_properties.unaliased(first)
    parses.request(first)
    parses.request(second)
    assert parses.misses == 2 and parses.hits == 0


def test_an_entry_never_answers_for_another_object_under_its_id() -> None:
    parses = podparse.PodParses()
    gpu_pod = {"spec": {"containers": [{"name": "c", "resources": {"limits": {"aliyun.com/gpu-mem": "4"}}}]}}
    assert parses.request(gpu_pod).memory_gib == 4
    cpu_pod: dict[str, Any] = {"spec": {"containers": [{"name": "c"}]}}
    # What a reused id would look like: the table's entry for cpu_pod's id belongs to another object.
    parses._requests[id(cpu_pod)] = parses._requests[id(gpu_pod)]
    assert parses.request(cpu_pod) == cardrequest.Request()
    # And for real: pods made and dropped in a loop reuse ids, and each still gets its own answer.
    for amount in range(1, 50):
        pod = {"spec": {"containers": [{"name": "c", "resources": {"limits": {"aliyun.com/gpu-mem": str(amount)}}}]}}
        assert parses.request(pod).memory_gib == amount
        del pod
        gc.collect()


def test_the_table_is_bounded_and_holds_what_it_answers_for() -> None:
    parses = podparse.PodParses(limit=8)
    for amount in range(1, 100):
        pod = {"spec": {"containers": [{"name": "c", "resources": {"limits": {"aliyun.com/gpu-mem": str(amount)}}}]}}
        assert parses.request(pod).memory_gib == amount
    assert len(parses._requests) <= 8
    assert all(entry[0] is not None for entry in parses._requests.values())


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="limit must be at least 1, got 0"):
        podparse.PodParses(limit=0)


def test_an_annotation_read_again_gives_the_same_fields() -> None:
    # `allocation._read` is kept by value: equal strings from two pods give equal answers, and a
    # malformed one stays malformed.
    text = allocation.encode(SHARED)
    assert allocation._read(text) == allocation._read("".join([text]))
    assert allocation._read("{not json") is None and allocation._read("{not json") is None
