"""The reservation ledger's home, a Lease per node: its name, its exact body, and who is trusted."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
from typing import Any

import pytest

from policies import gpu
from policies.gpu import allocation, reservations

NOW = 1_800_000_000.0
ENTRY = allocation.Allocation(
    uid="u1",
    namespace="team",
    name="p1",
    node="gpu-0",
    cards=(1,),
    memory_gib=4,
    core_percent=30,
    assumed_at=NOW,
    expires=NOW + 60,
    source="reservation",
)
OLD = allocation.Allocation(
    uid="u0",
    namespace="team",
    name="p0",
    node="gpu-0",
    cards=(0,),
    whole=True,
    assumed_at=NOW,
    expires=NOW + 60,
    source="reservation",
)


def test_a_lease_name_is_the_prefix_and_the_node_name() -> None:
    assert reservations.lease_name("gpu-0") == "gpu-ledger.gpu-0"
    longest = "n" * (253 - len("gpu-ledger."))
    assert reservations.lease_name(longest) == "gpu-ledger." + longest


def test_a_long_node_name_hashes_to_a_valid_name() -> None:
    node = "n" * (254 - len("gpu-ledger."))  # one character too long for the plain name
    name = reservations.lease_name(node)
    assert name == "gpu-ledger." + hashlib.sha256(node.encode()).hexdigest()[:40]
    assert len(name) == len("gpu-ledger.") + 40 <= 253
    assert reservations.lease_name(node + "x") != name


def test_the_lease_body_is_complete_and_exact() -> None:
    body = reservations.lease_body("gpu-0", "uid-123", {"u1": ENTRY}, "extender-a")
    assert body == {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": "gpu-ledger.gpu-0",
            "namespace": "gpu-admission",
            "labels": {"gpu-admission.io/ledger": "true"},
            "annotations": {
                "gpu-admission.io/node": "gpu-0",
                "gpu-admission.io/reservations": reservations.encode({"u1": ENTRY}),
            },
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "gpu-0", "uid": "uid-123"}],
        },
        "spec": {"holderIdentity": "extender-a"},
    }
    assert reservations.LEDGER_LABEL == gpu.LEDGER_LABEL and reservations.NODE_ANNOTATION == gpu.LEDGER_NODE_ANNOTATION


def test_the_lease_body_takes_another_namespace_and_leaves_out_an_unknown_owner() -> None:
    body = reservations.lease_body("gpu-0", "", {}, "x", namespace="kube-system")
    assert body["metadata"]["namespace"] == "kube-system"
    assert "ownerReferences" not in body["metadata"]
    assert body["metadata"]["annotations"][gpu.RESERVATIONS_ANNOTATION] == "{}"


@pytest.mark.parametrize("node", ["gpu-0", "g" * 250])
def test_a_lease_round_trips(node: str) -> None:
    entry = allocation.Allocation(
        uid="u1",
        namespace="team",
        name="p1",
        node=node,
        cards=(0, 2),
        memory_gib=3,
        assumed_at=NOW,
        expires=NOW + 9,
        source="reservation",
    )
    lease = reservations.lease_body(node, "uid", {"u1": entry}, "me")
    assert reservations.lease_node(lease) == node
    assert reservations.lease_reservations(lease) == {"u1": entry}
    assert reservations.leases_by_node([lease]) == {node: lease}


def test_a_lease_in_another_namespace_yields_nothing() -> None:
    """A tenant can create a Lease in its own namespace: it is no ledger, whatever it says."""
    forged = reservations.lease_body("gpu-0", "uid", {"u1": ENTRY}, "tenant", namespace="team")
    assert reservations.lease_node(forged) is None
    assert reservations.lease_reservations(forged) == {}
    assert reservations.leases_by_node([forged]) == {}
    # ...unless the readers were told the ledger lives there
    assert reservations.lease_reservations(forged, namespace="team") == {"u1": ENTRY}


def test_a_lease_without_its_node_annotation_or_under_another_name_yields_nothing() -> None:
    lease = reservations.lease_body("gpu-0", "uid", {"u1": ENTRY}, "me")
    unnamed = copy.deepcopy(lease)
    del unnamed["metadata"]["annotations"][gpu.LEDGER_NODE_ANNOTATION]
    empty = copy.deepcopy(lease)
    empty["metadata"]["annotations"][gpu.LEDGER_NODE_ANNOTATION] = ""
    renamed = copy.deepcopy(lease)
    renamed["metadata"]["name"] = "gpu-ledger.gpu-0-second"  # a second Lease claiming gpu-0
    wrong_type = copy.deepcopy(lease)
    wrong_type["metadata"]["annotations"][gpu.LEDGER_NODE_ANNOTATION] = ["gpu-0"]
    for bad in (unnamed, empty, renamed, wrong_type, {}, {"metadata": None}):
        assert reservations.lease_node(bad) is None
        assert reservations.lease_reservations(bad) == {}


@pytest.mark.parametrize("text", [None, "", "{oops", "[1]", 7])
def test_a_malformed_ledger_in_a_lease_is_empty(text: object) -> None:
    lease: dict[str, Any] = reservations.lease_body("gpu-0", "uid", {}, "me")
    if text is None:
        del lease["metadata"]["annotations"][gpu.RESERVATIONS_ANNOTATION]
    else:
        lease["metadata"]["annotations"][gpu.RESERVATIONS_ANNOTATION] = text
    assert reservations.lease_node(lease) == "gpu-0"
    assert reservations.lease_reservations(lease) == {}


def test_a_good_entry_in_a_lease_survives_beside_a_bad_one() -> None:
    lease = reservations.lease_body("gpu-0", "uid", {"u1": ENTRY}, "me")
    text = lease["metadata"]["annotations"][gpu.RESERVATIONS_ANNOTATION]
    lease["metadata"]["annotations"][gpu.RESERVATIONS_ANNOTATION] = text[:-1] + ',"bad":{"pod":"x/y"}}'
    assert reservations.lease_reservations(lease) == {"u1": ENTRY}


def test_the_union_holds_the_node_annotation_and_the_lease_and_the_lease_wins() -> None:
    stale = dataclasses.replace(OLD, uid="u1")  # the same pod in both: the old version's entry
    node = {
        "metadata": {"name": "gpu-0", "annotations": {gpu.RESERVATIONS_ANNOTATION: reservations.encode({"u0": OLD, "u1": stale})}}
    }
    lease = reservations.lease_body("gpu-0", "uid", {"u1": ENTRY}, "me")
    assert reservations.union(node, lease) == {"u0": OLD, "u1": ENTRY}
    assert reservations.union(node, None) == {"u0": OLD, "u1": stale}
    bare = {"metadata": {"name": "gpu-0"}}
    assert reservations.union(bare, lease) == {"u1": ENTRY}


def test_the_union_ignores_another_nodes_lease_and_a_tenants_lease() -> None:
    node = {"metadata": {"name": "gpu-0", "annotations": {gpu.RESERVATIONS_ANNOTATION: reservations.encode({"u0": OLD})}}}
    other = reservations.lease_body("gpu-1", "uid", {"u1": ENTRY}, "me")
    forged = reservations.lease_body("gpu-0", "uid", {"u1": ENTRY}, "tenant", namespace="team")
    assert reservations.union(node, other) == {"u0": OLD}
    assert reservations.union(node, forged) == {"u0": OLD}


def test_leases_by_node_keeps_only_trusted_leases() -> None:
    good = reservations.lease_body("gpu-0", "uid", {}, "me")
    forged = reservations.lease_body("gpu-1", "uid", {}, "tenant", namespace="team")
    stray = {"metadata": {"name": "kube-scheduler", "namespace": "gpu-admission"}}
    assert reservations.leases_by_node([good, forged, stray]) == {"gpu-0": good}
