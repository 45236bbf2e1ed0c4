"""The audit reads the reservation ledger where the extender keeps it now, a Lease per node in the
ledger namespace, together with the Node annotation of earlier versions; a Lease anywhere else is
never a ledger (tenants can create Leases in their own namespaces)."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from typing import Any

import kubernetes.client
import pytest

from policies import gpu, model
from policies import settings as settings_
from policies.gpu import allocation as allocation_
from policies.gpu import reservations
from tests.unit.audit.conftest import NOW, NodeFactory, PodFactory, allocation
from webhook.audit import cli, findings, kube, scan

FAIL, PASS = model.Result.FAIL, model.Result.PASS
LEASE_REF = findings.ObjectRef(
    namespace="gpu-admission", kind="Lease", name="gpu-ledger.cgpu-0", api_version="coordination.k8s.io/v1", uid="uid-lease"
)


def entry(uid: str, name: str, *, card: int = 1, mem: int = 4, assumed_at: float = NOW - 60) -> allocation_.Allocation:
    return allocation_.Allocation(
        uid=uid,
        namespace="team-a",
        name=name,
        node="cgpu-0",
        cards=(card,),
        memory_gib=mem,
        assumed_at=assumed_at,
        expires=NOW + 3600,
        source="reservation",
    )


def lease(ledger: dict[str, allocation_.Allocation], *, namespace: str = "gpu-admission", node: str = "cgpu-0") -> dict[str, Any]:
    body = reservations.lease_body(node, f"uid-node-{node}", ledger, "extender-0", namespace=namespace)
    body["metadata"]["uid"] = "uid-lease"
    return body


def node_ledger(ledger: dict[str, allocation_.Allocation]) -> dict[str, str]:
    return {gpu.RESERVATIONS_ANNOTATION: reservations.encode(ledger)}


def audit(*objects: dict[str, Any], **kwargs: Any) -> scan.Audit:
    return scan.run(scan.Inventory.of(objects), settings=settings_.Settings(), now=NOW, **kwargs)


def result(done: scan.Audit, policy: str, node: str = "cgpu-0") -> findings.Finding | None:
    found = [f for f in done.findings if f.policy == policy and f.subject.kind == "Node" and f.subject.name == node]
    assert len(found) <= 1
    return found[0] if found else None


def card(done: scan.Audit, index: int) -> Any:
    (state,) = [s for s in done.nodes if s.name == "cgpu-0"]
    return state.cards[index]


# --- GPU203 ---------------------------------------------------------------------------------------


def test_gpu203_an_orphaned_entry_in_the_lease_fails_and_points_at_the_lease(node: NodeFactory) -> None:
    done = audit(node(), lease({"uid-gone": entry("uid-gone", "gone")}))

    found = result(done, "GPU203")
    assert found is not None and found.result is FAIL
    assert (
        "team-a/gone (uid uid-gone) holds card 1 (ledger Lease gpu-admission/gpu-ledger.cgpu-0) but no longer exists"
        in found.message
    )
    assert found.related[0] == LEASE_REF
    assert [ref.name for ref in found.related[1:]] == ["gone"]
    assert found.subject.kind == "Node"


def test_gpu203_a_lease_entry_for_a_pod_being_bound_passes_and_holds_its_card(node: NodeFactory, pod: PodFactory) -> None:
    waiting = pod("new", uid="uid-new", gpu_mem=4)
    done = audit(node(), lease({"uid-new": entry("uid-new", "new")}), waiting)

    found = result(done, "GPU203")
    assert found is not None and found.result is PASS
    assert [a.pod_key for a in card(done, 1).allocations] == ["team-a/new"]


def test_gpu203_reads_the_node_annotation_and_the_lease_together(node: NodeFactory) -> None:
    """During an upgrade: the old version's entry on the Node and the new version's in the Lease."""
    old = node(annotations=node_ledger({"uid-old": entry("uid-old", "old", card=0)}))
    done = audit(old, lease({"uid-gone": entry("uid-gone", "gone")}))

    found = result(done, "GPU203")
    assert found is not None and found.result is FAIL
    assert "team-a/old (uid uid-old) holds card 0 but no longer exists" in found.message  # on the Node: no Lease named
    assert "team-a/gone (uid uid-gone) holds card 1 (ledger Lease gpu-admission/gpu-ledger.cgpu-0)" in found.message
    assert found.related[0] == LEASE_REF


def test_gpu203_the_node_annotation_alone_names_no_lease(node: NodeFactory) -> None:
    done = audit(node(annotations=node_ledger({"uid-old": entry("uid-old", "old")})))

    found = result(done, "GPU203")
    assert found is not None and found.result is FAIL
    assert "Lease" not in found.message and all(ref.kind != "Lease" for ref in found.related)


# --- the attacker's side: a Lease outside the ledger namespace -------------------------------------


def test_a_tenants_lease_is_no_ledger_it_neither_holds_cards_nor_is_judged(node: NodeFactory, pod: PodFactory) -> None:
    """A tenant who may create Leases in team-a forges one for cgpu-0, with the ledger label, the node
    annotation and the ledger name: it must not hold a card (a denial of service on others' pods),
    nor show up as the node's ledger."""
    forged = lease({"uid-x": entry("uid-x", "x", card=2, mem=15)}, namespace="team-a")
    assert forged["metadata"]["labels"] == {gpu.LEDGER_LABEL: "true"}
    done = audit(node(), forged)

    assert result(done, "GPU203") is None  # the node has no ledger at all
    assert card(done, 2).allocations == ()
    assert card(done, 2).memory_used == 0


def test_a_tenants_lease_cannot_hide_an_orphaned_entry_of_the_real_ledger(node: NodeFactory, pod: PodFactory) -> None:
    """Nor can it override the real ledger's entries: the real one's orphan still fails."""
    real = lease({"uid-gone": entry("uid-gone", "gone")})
    forged = lease({}, namespace="team-a")
    done = audit(node(), real, forged)

    found = result(done, "GPU203")
    assert found is not None and found.result is FAIL and "team-a/gone" in found.message


def test_a_second_lease_claiming_the_node_under_another_name_is_ignored(node: NodeFactory) -> None:
    stray = lease({"uid-x": entry("uid-x", "x", card=3)})
    stray["metadata"]["name"] = "gpu-ledger.cgpu-0-spare"
    done = audit(node(), stray)

    assert result(done, "GPU203") is None
    assert card(done, 3).allocations == ()


def test_the_ledger_namespace_is_the_one_given(node: NodeFactory) -> None:
    elsewhere = lease({"uid-gone": entry("uid-gone", "gone")}, namespace="ops")

    assert result(audit(node(), elsewhere), "GPU203") is None
    found = result(audit(node(), elsewhere, ledger_namespace="ops"), "GPU203")
    assert found is not None and found.result is FAIL and "(ledger Lease ops/gpu-ledger.cgpu-0)" in found.message


# --- GPU212 and GPU202 ----------------------------------------------------------------------------


def test_gpu212_a_stale_lease_entry_fails_naming_the_lease_and_a_fresh_one_passes(node: NodeFactory) -> None:
    stale = entry("uid-gone", "gone", assumed_at=NOW - 3600)
    found = result(audit(node(), lease({"uid-gone": stale})), "GPU212")
    assert found is not None and found.result is FAIL
    assert "in the reservation ledger (ledger Lease gpu-admission/gpu-ledger.cgpu-0)" in found.message
    assert found.related[0] == LEASE_REF

    fresh = entry("uid-gone", "gone", assumed_at=NOW - 5)
    passed = result(audit(node(), lease({"uid-gone": fresh})), "GPU212")
    assert passed is not None and passed.result is PASS


def test_gpu212_ignores_a_tenants_lease(node: NodeFactory) -> None:
    stale = entry("uid-gone", "gone", assumed_at=NOW - 3600)
    found = result(audit(node(), lease({"uid-gone": stale}, namespace="team-a")), "GPU212")
    assert found is not None and found.result is PASS


def test_gpu202_counts_a_lease_reservation_against_the_card(node: NodeFactory, pod: PodFactory) -> None:
    """A card reserved in the Lease (15 GiB card, 10 held there) and 10 GiB more by a bound pod: over-committed."""
    bound = pod("bound", uid="uid-bound", node_name="cgpu-0", gpu_mem=10, annotations=allocation("cgpu-0", [1], mem=10))
    waiting = pod("new", uid="uid-new", gpu_mem=10)
    over = audit(node(), lease({"uid-new": entry("uid-new", "new", mem=10)}), bound, waiting)
    found = result(over, "GPU202")
    assert found is not None and found.result is FAIL

    forged = audit(node(), lease({"uid-new": entry("uid-new", "new", mem=10)}, namespace="team-a"), bound, waiting)
    passed = result(forged, "GPU202")
    assert passed is not None and passed.result is PASS


# --- listing: the ledger namespace only, paged, a forbidden list is a warning -----------------------


class Response:
    def __init__(self, body: dict[str, Any]) -> None:
        self.data = json.dumps(body).encode()


class FakeCoordination:
    """CoordinationV1Api's namespaced Lease list: two pages of one Lease each (or a 403)."""

    def __init__(self, *, forbidden: bool = False) -> None:
        self.forbidden = forbidden
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def list_namespaced_lease(self, namespace: str, **kwargs: Any) -> Response:
        self.calls.append((namespace, kwargs))
        if self.forbidden:
            from webhook.kube import client_exceptions  # noqa: PLC0415 - the lazy kubernetes handle

            raise client_exceptions.ApiException(status=403, reason="Forbidden")
        if kwargs.get("_continue") == "page-2":
            return Response({"metadata": {}, "items": [lease({}, node="cgpu-1")]})
        return Response({"metadata": {"continue": "page-2"}, "items": [lease({}, node="cgpu-0")]})

    def list_lease_for_all_namespaces(self, **kwargs: Any) -> Response:
        raise AssertionError("a Lease outside the ledger namespace is never a ledger: never list them all")


@pytest.fixture
def coordination(monkeypatch: pytest.MonkeyPatch) -> FakeCoordination:
    fake = FakeCoordination()
    monkeypatch.setattr(kubernetes.client, "CoordinationV1Api", lambda api: fake)
    return fake


def test_the_ledger_leases_are_listed_in_the_ledger_namespace_by_label_page_by_page(coordination: FakeCoordination) -> None:
    listed = kube.ledger_leases(object(), namespace="gpu-admission", chunk=1)  # type: ignore[arg-type]

    assert [(o["kind"], o["apiVersion"], o["metadata"]["name"]) for o in listed] == [
        ("Lease", "coordination.k8s.io/v1", "gpu-ledger.cgpu-0"),
        ("Lease", "coordination.k8s.io/v1", "gpu-ledger.cgpu-1"),
    ]
    assert [namespace for namespace, _ in coordination.calls] == ["gpu-admission", "gpu-admission"]
    assert [kwargs.get("_continue") for _, kwargs in coordination.calls] == [None, "page-2"]
    assert all(
        kwargs["limit"] == 1 and kwargs["label_selector"] == "gpu-admission.io/ledger=true" for _, kwargs in coordination.calls
    )


def test_a_forbidden_lease_listing_is_a_warning(coordination: FakeCoordination, caplog: pytest.LogCaptureFixture) -> None:
    coordination.forbidden = True

    assert kube.ledger_leases(object(), namespace="gpu-admission") == []  # type: ignore[arg-type]
    assert "reservation ledger Leases not read" in caplog.text


def test_the_stream_lists_the_leases_before_the_pods_and_only_for_a_whole_cluster_audit(
    coordination: FakeCoordination, monkeypatch: pytest.MonkeyPatch
) -> None:
    kinds: list[str] = []

    def pages(listing: Any, **kwargs: Any) -> Any:
        kinds.append(listing.kind)
        return iter(())

    monkeypatch.setattr(kube, "_pages", pages)
    monkeypatch.setattr(kube, "env_sources", lambda core, **kwargs: [])
    monkeypatch.setattr(kube, "_namespaces", lambda api, **kwargs: [])
    list(kube.objects(object(), ledger_namespace="ops"))  # type: ignore[arg-type]
    assert kinds[:2] == ["Node", "Lease"] and kinds[-1] == "Pod" and kinds.count("Lease") == 1

    kinds.clear()
    list(kube.objects(object(), namespace="team-a"))  # type: ignore[arg-type]
    assert "Lease" not in kinds


# --- the command ----------------------------------------------------------------------------------


def test_the_command_takes_the_ledger_namespace(
    node: NodeFactory, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now = time.time()  # the command judges at the present moment
    gone = dataclasses.replace(entry("uid-gone", "gone"), assumed_at=now - 60, expires=now + 3600)
    manifest = tmp_path / "cluster.json"
    manifest.write_text(
        json.dumps({"apiVersion": "v1", "kind": "List", "items": [node(), lease({"uid-gone": gone}, namespace="ops")]})
    )

    cli.main(["-f", str(manifest), "-o", "json"])
    assert "ledger Lease" not in capsys.readouterr().out

    cli.main(["-f", str(manifest), "-o", "json", "--ledger-namespace", "ops"])
    assert "(ledger Lease ops/gpu-ledger.cgpu-0)" in capsys.readouterr().out
