"""The allocation annotations and the reservation ledger: exact bytes, round trips, bad input."""

from __future__ import annotations

import dataclasses

import pytest

from policies import gpu
from policies.gpu import allocation, cardrequest, reservations

NOW = 1_800_000_000.0
SHARED = allocation.Allocation(
    uid="u1", namespace="ns", name="p1", node="gpu-0", cards=(1,), memory_gib=4, core_percent=30, assumed_at=NOW
)
WHOLE = allocation.Allocation(uid="u2", namespace="ns", name="p2", node="gpu-1", cards=(0, 3), whole=True, assumed_at=NOW)


def test_our_allocation_annotation_has_its_exact_bytes() -> None:
    assert allocation.encode(SHARED) == (
        '{"node":"gpu-0","cards":[1],"memGiB":4,"corePercent":30,"whole":false,"assumedAt":"2027-01-15T08:00:00.000Z"}'
    )


@pytest.mark.parametrize("held", [SHARED, WHOLE])
def test_an_allocation_round_trips(held: allocation.Allocation) -> None:
    decoded = allocation.decode(allocation.encode(held))
    assert decoded == allocation.Allocation(
        uid="",
        namespace="",
        name="",
        node=held.node,
        cards=held.cards,
        memory_gib=held.memory_gib,
        core_percent=held.core_percent,
        whole=held.whole,
        assumed_at=held.assumed_at,
    )


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{oops", "not JSON"),
        ("[1]", "expected a JSON object, got list"),
        ('{"cards": [0]}', "node must be a non-empty string, got None"),
        ('{"node": "", "cards": [0]}', "node must be a non-empty string, got ''"),
        ('{"node": "n", "cards": []}', "cards must be a non-empty list of card indices, got []"),
        ('{"node": "n", "cards": [-1]}', "cards must be a non-empty list of card indices, got [-1]"),
        ('{"node": "n", "cards": [0], "memGiB": "4"}', "memGiB must be a non-negative integer, got '4'"),
        ('{"node": "n", "cards": [0], "corePercent": -5}', "corePercent must be a non-negative integer, got -5"),
        ('{"node": "n", "cards": [0], "whole": 1}', "whole must be true or false, got 1"),
    ],
)
def test_a_malformed_allocation_is_a_clear_error_and_holds_nothing(text: str, said: str) -> None:
    with pytest.raises(gpu.AnnotationError) as raised:
        allocation.decode(text)
    assert str(raised.value).startswith(f"{gpu.ALLOCATION_ANNOTATION}: {said}")
    pod = {"metadata": {"annotations": {gpu.ALLOCATION_ANNOTATION: text}}, "spec": {"nodeName": "n"}}
    assert allocation.pod_allocation(pod, now=NOW) is None and allocation.annotated_node(pod) == ""


def test_bind_writes_gpushare_keys_beside_ours_for_a_shared_pod_and_fewer_for_whole_cards() -> None:
    assert allocation.bind_annotations(SHARED, card_memory_gib=15) == {
        gpu.GPUSHARE_MEM_IDX_ANNOTATION: "1",
        gpu.GPUSHARE_MEM_POD_ANNOTATION: "4",
        gpu.GPUSHARE_MEM_DEV_ANNOTATION: "15",
        gpu.GPUSHARE_MEM_ASSIGNED_ANNOTATION: "false",
        gpu.GPUSHARE_MEM_ASSUME_TIME_ANNOTATION: "1800000000000000000",
        gpu.ALLOCATION_ANNOTATION: allocation.encode(SHARED),
    }
    written = allocation.bind_annotations(WHOLE, card_memory_gib=80)
    assert written[gpu.GPUSHARE_MEM_IDX_ANNOTATION] == "0,3"
    assert gpu.GPUSHARE_MEM_POD_ANNOTATION not in written and gpu.GPUSHARE_MEM_DEV_ANNOTATION not in written
    assert set(written) <= set(gpu.ALLOCATION_ANNOTATIONS)


def test_what_a_pod_holds_is_read_back_from_what_bind_wrote() -> None:
    pod = {
        "metadata": {
            "uid": "u1",
            "namespace": "ns",
            "name": "p1",
            "annotations": allocation.bind_annotations(SHARED, card_memory_gib=15),
        },
        "spec": {"nodeName": "gpu-0"},
    }
    assert allocation.pod_allocation(pod, now=NOW) == dataclasses.replace(SHARED, bound=True)
    assert allocation.pod_allocation({**pod, "status": {"phase": "Succeeded"}}, now=NOW) is None
    assert allocation.annotated_node(pod) == "gpu-0" and allocation.bound_node(pod) == "gpu-0"


def test_times_are_rfc3339_utc_with_milliseconds() -> None:
    assert allocation.timestamp(NOW + 0.25) == "2027-01-15T08:00:00.250Z"
    assert allocation.parse_time("2027-01-15T08:00:00.250Z") == NOW + 0.25
    assert allocation.parse_time("2027-01-15T08:00:00") == NOW  # naive times are UTC
    assert allocation.parse_time("yesterday") is None and allocation.parse_time(5) is None


# --- the reservation ledger ---


def test_the_ledger_has_its_exact_bytes_sorted_by_uid() -> None:
    entry = allocation.Allocation(
        uid="b", namespace="ns", name="p", node="gpu-0", cards=(2,), memory_gib=8, assumed_at=NOW, expires=NOW + 60
    )
    other = allocation.Allocation(
        uid="a", namespace="ns", name="q", node="gpu-0", cards=(0,), whole=True, assumed_at=NOW, expires=NOW + 60
    )
    assert reservations.encode({"b": entry, "a": other}) == (
        '{"a":{"pod":"ns/q","node":"gpu-0","cards":[0],"memGiB":0,"corePercent":0,"whole":true,'
        '"assumedAt":"2027-01-15T08:00:00.000Z","expires":"2027-01-15T08:01:00.000Z"},'
        '"b":{"pod":"ns/p","node":"gpu-0","cards":[2],"memGiB":8,"corePercent":0,"whole":false,'
        '"assumedAt":"2027-01-15T08:00:00.000Z","expires":"2027-01-15T08:01:00.000Z"}}'
    )


def test_the_ledger_round_trips() -> None:
    entry = allocation.Allocation(
        uid="u",
        namespace="ns",
        name="p",
        node="gpu-0",
        cards=(1, 2),
        memory_gib=3,
        core_percent=20,
        assumed_at=NOW,
        expires=NOW + 60,
        source="reservation",
    )
    text = reservations.encode({"u": entry})
    assert reservations.decode(text) == reservations.read(text) == {"u": entry}
    node = {"metadata": {"annotations": {gpu.RESERVATIONS_ANNOTATION: text}}}
    assert reservations.node_reservations(node) == {"u": entry}


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{oops", "not JSON"),
        ("[]", "expected a JSON object from pod UID to entry, got list"),
        ('{"v": 3}', "entry 'v': expected an object, got int"),
        ('{"u": {"pod": "a/b"}}', "entry 'u': node must be a non-empty string, got None"),
        ('{"u": {"pod": "a/b", "node": "n", "cards": [0]}}', "entry 'u': expires must be an RFC 3339 time, got None"),
        (
            '{"u": {"node": "n", "cards": [0], "expires": "2027-01-15T08:00:00Z"}}',
            "entry 'u': pod must be a namespace/name string, got None",
        ),
    ],
)
def test_a_malformed_ledger_is_a_clear_error_and_its_bad_entries_are_dropped(text: str, said: str) -> None:
    with pytest.raises(gpu.AnnotationError) as raised:
        reservations.decode(text)
    assert str(raised.value).startswith(f"{gpu.RESERVATIONS_ANNOTATION}: {said}")
    assert reservations.read(text) == {}


def test_a_good_entry_survives_beside_a_bad_one() -> None:
    good = allocation.Allocation(
        uid="g", namespace="ns", name="p", node="n", cards=(0,), assumed_at=NOW, expires=NOW + 1, source="reservation"
    )
    text = reservations.encode({"g": good})[:-1] + ',"bad":3}'
    assert reservations.read(text) == {"g": good}


def test_prune_drops_expired_entries_and_pods_seen_bound_or_finished() -> None:
    entry = allocation.Allocation(uid="u", namespace="ns", name="p", node="n", cards=(0,), assumed_at=NOW, expires=NOW + 60)
    bound = {"metadata": {"uid": "u"}, "spec": {"nodeName": "n"}}
    done = {"metadata": {"uid": "u"}, "status": {"phase": "Failed"}}
    waiting = {"metadata": {"uid": "u"}}
    assert reservations.prune({"u": entry}, pods=[waiting], now=NOW) == {"u": entry}
    assert reservations.prune({"u": entry}, pods=[bound], now=NOW) == {}
    assert reservations.prune({"u": entry}, pods=[done], now=NOW) == {}
    assert reservations.prune({"u": entry}, pods=[], now=NOW + 60) == {}


# --- what a pod asks for ---


def _pod(limits: dict[str, str]) -> dict[str, object]:
    return {"spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        ({"aliyun.com/gpu-mem": "4"}, cardrequest.Request(memory_gib=4)),
        ({"aliyun.com/gpu-mem": "4", "aliyun.com/gpu-core.percentage": "30"}, cardrequest.Request(memory_gib=4, core_percent=30)),
        ({"aliyun.com/gpu": "2"}, cardrequest.Request(cards=2)),
        ({"nvidia.com/gpu": "1"}, cardrequest.Request()),
    ],
)
def test_a_pods_request_of_the_extender(limits: dict[str, str], expected: cardrequest.Request) -> None:
    assert cardrequest.pod_request(_pod(limits)) == expected


@pytest.mark.parametrize(
    ("limits", "said"),
    [
        ({"aliyun.com/gpu": "1", "aliyun.com/gpu-mem": "4"}, "cannot be combined"),
        ({"aliyun.com/gpu-core.percentage": "30"}, "needs aliyun.com/gpu-mem beside it"),
        ({"aliyun.com/gpu-mem": "4", "aliyun.com/gpu-core.percentage": "130"}, "more than one card (100)"),
        ({"aliyun.com/gpu-mem": "1.5"}, "not a whole non-negative number"),
    ],
)
def test_a_malformed_request_says_why(limits: dict[str, str], said: str) -> None:
    request = cardrequest.pod_request(_pod(limits))
    assert said in request.problem and request.managed and request.family is None
