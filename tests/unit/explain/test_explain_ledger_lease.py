"""explain, simulate and snapshot count the reservation ledger where the extender keeps it now (a
Lease per node in the ledger namespace) with the Node annotation of earlier versions; a Lease in any
other namespace (tenants can create Leases in theirs) holds nothing."""

from __future__ import annotations

import argparse
import json
import pathlib
from collections.abc import Callable
from typing import Any

import pytest

from policies import gpu
from policies.gpu import allocation, reservations
from tests.unit.explain.conftest import ledger_entry
from webhook import cli
from webhook.cmdline import errors
from webhook.explain import analysis, snapshot
from webhook.explain import cli as explain_cli
from webhook.kube import errors as kube_errors

NOW = 1_800_000_000.0
Factory = Callable[..., dict[str, Any]]


def lease(node: str, ledger: dict[str, allocation.Allocation], *, namespace: str = "gpu-admission") -> dict[str, Any]:
    return reservations.lease_body(node, f"uid-{node}", ledger, "extender-0", namespace=namespace)


def gone(
    node: str = "n", *, card: int = 0, mem: int = 16, uid: str = "gone-uid", assumed_at: float = NOW - 2
) -> allocation.Allocation:
    return ledger_entry(uid, pod_key="team-a/deleted", node_name=node, card=card, mem=mem, assumed_at=assumed_at)


def codes(report: analysis.Report, node: str = "n") -> list[str]:
    (verdict,) = [v for v in report.nodes if v.node == node]
    return [str(c) for c in verdict.codes]


def explain(pod: dict[str, Any], nodes: list[dict[str, Any]], pods: list[dict[str, Any]], **kwargs: Any) -> analysis.Report:
    return analysis.explain(pod, cluster=analysis.Cluster(nodes, [*pods, pod], now=NOW, **kwargs))


# --- explain --------------------------------------------------------------------------------------


def test_a_lease_reservation_of_a_gone_pod_is_a_stale_allocation(make_node: Factory, make_pod: Factory) -> None:
    report = explain(make_pod("waiting", mem=8), [make_node("n", count=1, gib=16)], [], leases=[lease("n", {"gone-uid": gone()})])

    assert codes(report)[0] == "STALE_ALLOCATION"
    assert "team-a/deleted" in report.nodes[0].reasons[0].message


def test_a_lease_reservation_of_a_bind_in_flight_holds_its_card(make_node: Factory, make_pod: Factory) -> None:
    flying = make_pod("flying", mem=12, uid="flying-uid")
    entry = ledger_entry("flying-uid", pod_key="team-a/flying", node_name="n", card=0, mem=12, assumed_at=NOW - 3)
    report = explain(
        make_pod("next", mem=8), [make_node("n", count=1, gib=16)], [flying], leases=[lease("n", {"flying-uid": entry})]
    )

    assert codes(report) == ["RESERVED_IN_FLIGHT", "INSUFFICIENT_MEMORY"]


def test_explain_counts_the_node_annotation_and_the_lease_together(make_node: Factory, make_pod: Factory) -> None:
    """During an upgrade: one card reserved on the Node by the old version, the other in the Lease."""
    old = gone(card=0, uid="old-uid")
    node = make_node("n", count=2, gib=16, annotations={gpu.RESERVATIONS_ANNOTATION: reservations.encode({"old-uid": old})})
    report = explain(make_pod("waiting", mem=8), [node], [], leases=[lease("n", {"gone-uid": gone(card=1)})])

    assert not report.nodes[0].fits
    state = report.nodes[0].state
    assert state is not None and [sorted(a.uid for a in c.allocations) for c in state.cards] == [["old-uid"], ["gone-uid"]]
    # either alone leaves a card free
    assert explain(make_pod("waiting", mem=8), [node], []).nodes[0].fits
    assert (
        explain(
            make_pod("waiting", mem=8), [make_node("n", count=2, gib=16)], [], leases=[lease("n", {"gone-uid": gone(card=1)})]
        )
        .nodes[0]
        .fits
    )


def test_a_tenants_lease_holds_no_card(make_node: Factory, make_pod: Factory) -> None:
    """A Lease a tenant forged in team-a, naming node n and its ledger name, must not block the node."""
    forged = lease("n", {"gone-uid": gone()}, namespace="team-a")
    report = explain(make_pod("waiting", mem=8), [make_node("n", count=1, gib=16)], [], leases=[forged])

    assert report.nodes[0].fits and report.nodes[0].codes == ()


def test_a_lease_of_another_node_or_under_another_name_holds_nothing_here(make_node: Factory, make_pod: Factory) -> None:
    other = lease("m", {"gone-uid": gone(node="m")})
    renamed = lease("n", {"gone-uid": gone()})
    renamed["metadata"]["name"] = "spare"
    report = explain(make_pod("waiting", mem=8), [make_node("n", count=1, gib=16)], [], leases=[other, renamed])

    assert report.nodes[0].fits


def test_the_ledger_namespace_is_the_one_given(make_node: Factory, make_pod: Factory) -> None:
    ops = lease("n", {"gone-uid": gone()}, namespace="ops")
    report = explain(make_pod("waiting", mem=8), [make_node("n", count=1, gib=16)], [], leases=[ops], ledger_namespace="ops")

    assert codes(report)[0] == "STALE_ALLOCATION"


# --- simulate -------------------------------------------------------------------------------------


def test_simulate_places_around_a_lease_reservation_and_ignores_a_tenants(make_node: Factory, make_pod: Factory) -> None:
    nodes = [make_node("n", count=1, gib=16)]
    batch = [make_pod("new", mem=8)]
    held = explain_cli.simulate_batch(batch, nodes=nodes, pods=[], now=NOW, leases=[lease("n", {"gone-uid": gone()})])
    assert held is not None and held.unplaced == 1

    forged = explain_cli.simulate_batch(
        batch, nodes=nodes, pods=[], now=NOW, leases=[lease("n", {"gone-uid": gone()}, namespace="team-a")]
    )
    assert forged is not None and forged.unplaced == 0 and forged.landings[0].node == "n"


# --- snapshot -------------------------------------------------------------------------------------


def test_a_snapshot_keeps_the_ledger_leases_and_leaves_a_tenants_out(make_node: Factory, tmp_path: pathlib.Path) -> None:
    real = lease("n", {"gone-uid": gone()})
    real["metadata"]["managedFields"] = [{"manager": "extender"}]
    forged = lease("n", {"x": gone(uid="x")}, namespace="team-a")
    taken = snapshot.take([make_node("n", count=1, gib=16)], [], now=NOW, leases=[real, forged])

    assert [(lease_["metadata"]["namespace"], lease_["metadata"]["name"]) for lease_ in taken.leases] == [
        ("gpu-admission", "gpu-ledger.n")
    ]
    kept = taken.leases[0]
    assert "managedFields" not in kept["metadata"] and "ownerReferences" not in kept["metadata"]
    assert reservations.lease_reservations(kept) == {"gone-uid": gone()}
    document = snapshot.document(taken)
    assert document["ledgerNamespace"] == "gpu-admission"
    assert document["reservations"] == {"n": json.loads(reservations.encode({"gone-uid": gone()}))}

    path = tmp_path / "snap.json"
    path.write_text(snapshot.dumps(taken, as_json=True))
    loaded = snapshot.load(str(path))
    assert (loaded.leases, loaded.ledger_namespace) == (taken.leases, "gpu-admission")


def test_explain_from_a_snapshot_counts_its_leases(
    make_node: Factory, make_pod: Factory, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    waiting = make_pod("waiting", mem=8)
    path = tmp_path / "snap.json"
    ops = lease("n", {"gone-uid": gone()}, namespace="ops")
    taken = snapshot.take([make_node("n", count=1, gib=16)], [waiting], now=NOW, leases=[ops], ledger_namespace="ops")
    path.write_text(snapshot.dumps(taken, as_json=True))

    assert cli.main(["explain", "pod", "waiting", "-n", "team-a", "--snapshot", str(path), "-o", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert "STALE_ALLOCATION" in json.dumps(shown["nodes"])


def test_a_snapshot_from_before_the_lease_still_loads(make_node: Factory, tmp_path: pathlib.Path) -> None:
    document = snapshot.document(snapshot.take([make_node("n")], [], now=NOW))
    del document["leases"], document["ledgerNamespace"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(document))

    loaded = snapshot.load(str(path))
    assert (loaded.leases, loaded.ledger_namespace) == ([], "gpu-admission")


@pytest.mark.parametrize(
    ("change", "said"),
    [({"leases": {"a": 1}}, "leases must be a list"), ({"ledgerNamespace": 7}, "ledgerNamespace must be a namespace name")],
)
def test_a_bad_ledger_part_of_a_snapshot_is_one_line(
    make_node: Factory, tmp_path: pathlib.Path, change: dict[str, Any], said: str
) -> None:
    document = snapshot.document(snapshot.take([make_node("n")], [], now=NOW)) | change
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))

    with pytest.raises(errors.InputError, match=f"bad.json: {said}$"):
        snapshot.load(str(path))


# --- reading the live cluster ---------------------------------------------------------------------


class FakeClient:
    def __init__(self, *, fail: bool = False) -> None:
        self.fail = fail
        self.calls: list[tuple[str, str]] = []

    def list(self, path: str, *, label_selector: str = "", **kwargs: Any) -> tuple[list[dict[str, Any]], str]:
        self.calls.append((path, label_selector))
        if self.fail:
            raise kube_errors.KubeError("leases is forbidden")
        return [lease("n", {})], "9"


def test_the_live_leases_are_listed_in_the_ledger_namespace_by_label(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeClient()
    monkeypatch.setattr(explain_cli, "_client", lambda args: fake)

    leases, namespace = explain_cli.read_ledgers(argparse.Namespace(snapshot=None, ledger_namespace="ops"))

    assert fake.calls == [("/apis/coordination.k8s.io/v1/namespaces/ops/leases", "gpu-admission.io/ledger=true")]
    assert (len(leases), namespace) == (1, "ops")


def test_unreadable_leases_are_a_warning(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(explain_cli, "_client", lambda args: FakeClient(fail=True))

    assert explain_cli.read_ledgers(argparse.Namespace(snapshot=None, ledger_namespace="gpu-admission")) == ([], "gpu-admission")
    assert "warning: cannot read the ledger Leases in namespace gpu-admission" in capsys.readouterr().err
