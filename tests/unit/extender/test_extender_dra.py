"""Cards a DRA driver has allocated (ResourceClaims on devices whose UUID is one of our cards) are
not offered to shared pods (`DRA_ALLOCATED`): in the placement, the extender's cache as claims come
and go, inspect's views and explain's report."""

from __future__ import annotations

import json
from typing import Any

from policies.gpu import cardrequest, cards, dra, inspection, reasons
from tests import dra_objects
from tests.unit.extender.conftest import node as make_node
from tests.unit.extender.conftest import pod as make_pod
from webhook.explain import analysis, snapshot
from webhook.explain import cli as explain_cli
from webhook.extender import placement, store

NOW = 1_800_000_000.0


def _claim(
    node: str, device: str, *, name: str = "train", namespace: str = "ml", uid: str = "c-1", **extra: Any
) -> dict[str, Any]:
    return dra_objects.claim(name, namespace=namespace, uid=uid, allocated=(node, device), **extra)


NODE = make_node("gpu-0", count=2, gib=15, inventory=[15360, 15360])  # cards GPU-0000, GPU-0001
SLICE = dra_objects.slice_for("gpu-0", ["GPU-0000", "GPU-0001"])


def _state(claims: list[dict[str, Any]]) -> cards.NodeState:
    held = dra.holds([SLICE], claims)
    return cards.node_state(NODE, (), now=NOW, dra_holds=held.get("gpu-0", dra.NO_HOLDS))


def test_a_card_dra_allocated_is_not_offered_and_the_pod_goes_to_the_other_card() -> None:
    request = cardrequest.pod_request(make_pod(mem=4))
    fit = placement.evaluate(request, _state([_claim("gpu-0", "gpu-0")]))
    assert fit.fits and fit.cards == (1,)
    unclaimed = placement.evaluate(request, _state([]))
    assert unclaimed.cards == (0,)  # binpack takes the lowest index among equals: the claim moved it


def test_a_node_whose_cards_dra_holds_all_refuses_with_dra_allocated_for_now() -> None:
    request = cardrequest.pod_request(make_pod(mem=4))
    state = _state([_claim("gpu-0", "gpu-0"), _claim("gpu-0", "gpu-1", name="infer", uid="c-2")])
    fit = placement.evaluate(request, state)
    assert fit.verdict is placement.Verdict.FULL  # released claims free the cards: not unresolvable
    assert fit.codes[0] is reasons.Code.DRA_ALLOCATED
    assert "ml/train" in fit.message and "ml/infer" in fit.message and "GPU-0001" in fit.message


def test_a_share_of_a_device_still_takes_the_card() -> None:
    state = _state([_claim("gpu-0", "gpu-0", consumedCapacity={"memory": "8Gi"}, shareID="a1")])
    card = state.card(0)
    assert card is not None and card.memory_free == 0 and card.core_free == 0
    (held,) = card.dra
    assert held.shared and held.consumed == (("memory", "8Gi"),)


def test_an_admin_access_claim_takes_no_card() -> None:
    state = _state([_claim("gpu-0", "gpu-0", adminAccess=True)])
    assert all(not c.dra for c in state.cards)


def test_whole_card_pods_count_dra_cards_as_not_free() -> None:
    topo = make_node("t", mode="topology", count=2, inventory=[15360, 15360])
    held = dra.holds([dra_objects.slice_for("t", ["GPU-0000", "GPU-0001"])], [_claim("t", "gpu-1")])
    state = cards.node_state(topo, (), now=NOW, dra_holds=held["t"])
    fit = placement.evaluate(cardrequest.pod_request(make_pod(whole=2)), state)
    assert fit.verdict is placement.Verdict.FULL and fit.codes == (reasons.Code.DRA_ALLOCATED, reasons.Code.NO_TOPOLOGY_SET)


def test_the_cache_follows_claims_allocated_and_released() -> None:
    cache = store.Store()
    cache.replace_nodes([NODE])
    cache.replace_pods([])
    cache.replace_leases([])
    freed: list[str] = []
    cache.on_freed = freed.append
    cache.replace_slices([SLICE])
    cache.replace_claims([])
    request = cardrequest.pod_request(make_pod(mem=4))
    before = cache.version("gpu-0")
    claim = _claim("gpu-0", "gpu-0")
    cache.apply("ResourceClaim", "ADDED", {**claim, "status": {}})  # created, not allocated yet: holds nothing
    assert cache.version("gpu-0") == before
    cache.apply("ResourceClaim", "MODIFIED", claim)
    state = cache.state("gpu-0", now=NOW, ttl=60.0)
    assert state is not None and placement.evaluate(request, state).cards == (1,)
    cache.apply("ResourceClaim", "DELETED", claim)
    state = cache.state("gpu-0", now=NOW, ttl=60.0)
    assert state is not None and placement.evaluate(request, state).cards == (0,)
    assert freed == ["gpu-0"]  # kube-scheduler hears that the card came free


def test_inspect_shows_the_dra_card_in_each_view() -> None:
    state = _state([_claim("gpu-0", "gpu-1")])
    table = inspection.summary([state])
    assert "0/15" in table and "DRA/15" in table
    details = inspection.details([state])
    assert any(line.split()[:4] == ["train", "ml", "0", "DRA"] for line in details.splitlines())
    wide = inspection.wide([state]).splitlines()
    assert wide[0].split()[-1] == "DRA" and wide[2].split()[-1] == "ml/train"
    document = inspection.as_json([state])
    assert document["nodes"][0]["devs"][1]["dra"] == [
        {"claim": "ml/train", "driver": "gpu.nvidia.com", "pool": "gpu-0", "device": "gpu-1", "shared": False}
    ]
    assert "dra" not in document["nodes"][0]["devs"][0]
    json.dumps(document)


def test_inspect_without_dra_is_unchanged() -> None:
    state = _state([])
    assert "DRA" not in inspection.summary([state]) + inspection.wide([state]) + inspection.details([state])


def test_explain_names_the_claim_that_holds_the_card() -> None:
    pending = make_pod(mem=4)
    cluster = analysis.Cluster(
        [NODE],
        [pending],
        now=NOW,
        slices=[SLICE],
        claims=[_claim("gpu-0", "gpu-0"), _claim("gpu-0", "gpu-1", name="infer", uid="c-2")],
    )
    report = analysis.explain(pending, cluster=cluster)
    (verdict,) = report.nodes
    assert reasons.Code.DRA_ALLOCATED in verdict.codes and not verdict.fits
    released = analysis.Cluster([NODE], [pending], now=NOW, slices=[SLICE], claims=[_claim("gpu-0", "gpu-0")])
    assert analysis.explain(pending, cluster=released).nodes[0].fits


def test_simulate_places_around_the_claimed_card_and_a_snapshot_keeps_slices_and_claims(tmp_path: Any) -> None:
    claims = [_claim("gpu-0", "gpu-0")]
    wanted = make_pod("next", mem=10)
    wanted["spec"]["nodeSelector"] = {"ack.node.gpu.schedule": "cgpu"}
    result = explain_cli.simulate_batch([wanted], nodes=[NODE], pods=[], now=NOW, slices=[SLICE], claims=claims)
    assert result is not None
    (landing,) = result.landings
    assert (landing.node, landing.cards) == ("gpu-0", (1,))
    taken = snapshot.take([NODE], [], now=NOW, slices=[SLICE], claims=[*claims, dra_objects.claim("pending", namespace="ml")])
    path = tmp_path / "snap.json"
    path.write_text(snapshot.dumps(taken, as_json=True))
    loaded = snapshot.load(str(path))
    assert dra.holds(loaded.slices, loaded.claims) == dra.holds([SLICE], claims)
    assert [c["metadata"]["name"] for c in loaded.claims] == ["train"]  # claims not allocated hold nothing: left out
