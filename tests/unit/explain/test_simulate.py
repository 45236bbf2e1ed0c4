"""simulate: the manifests' GPU pods placed in order with the extender's placement, reasons for those that
do not fit, workloads expanded, admission applied, and how many nodes of a kind a batch needs."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from webhook import cli
from webhook.explain import cli as explain_cli
from webhook.explain import simulate, snapshot

NOW = 1_800_000_000.0
Factory = Callable[..., dict[str, Any]]


def _pods(make_pod: Factory, sizes: list[int]) -> list[dict[str, Any]]:
    return [make_pod(f"p{i}", mem=size) for i, size in enumerate(sizes)]


def test_binpack_fills_one_card_then_the_next_as_the_extender_would(make_node: Factory, make_pod: Factory) -> None:
    result = explain_cli.simulate_batch(_pods(make_pod, [6, 6, 6, 10]), nodes=[make_node("a", count=2, gib=16)], pods=[], now=NOW)
    assert result is not None
    assert [(landing.node, landing.cards) for landing in result.landings] == [("a", (0,)), ("a", (0,)), ("a", (1,)), ("a", (1,))]
    assert [c.memory_used for c in result.states["a"].cards] == [12, 16]


def test_spread_puts_each_pod_on_the_emptiest_card(make_node: Factory, make_pod: Factory) -> None:
    result = explain_cli.simulate_batch(
        _pods(make_pod, [4, 4, 4]), nodes=[make_node("s", placement="spread", count=4, gib=16)], pods=[], now=NOW
    )
    assert result is not None and [landing.cards for landing in result.landings] == [(0,), (1,), (2,)]


def test_the_binpack_node_that_is_fuller_wins_and_equal_nodes_are_reported_as_ties(
    make_node: Factory, make_pod: Factory, make_placed: Factory
) -> None:
    nodes = [make_node("a", count=2), make_node("b", count=2), make_node("c", count=2)]
    busy = [make_placed("busy", node_name="b", card=0, mem=8)]
    result = explain_cli.simulate_batch(_pods(make_pod, [4]), nodes=nodes, pods=busy, now=NOW)
    assert result is not None and result.landings[0].node == "b" and result.landings[0].ties == ()
    fresh = explain_cli.simulate_batch(_pods(make_pod, [4]), nodes=nodes, pods=[], now=NOW)
    assert fresh is not None and fresh.landings[0].node == "a" and fresh.landings[0].ties == ("b", "c")


def test_a_pod_that_does_not_fit_gets_explains_reasons_and_later_pods_still_land(make_node: Factory, make_pod: Factory) -> None:
    result = explain_cli.simulate_batch(
        _pods(make_pod, [10, 10, 10, 4]), nodes=[make_node("a", count=3, gib=16)], pods=[], now=NOW
    )
    assert result is not None
    assert [landing.node for landing in result.landings] == ["a", "a", "a", "a"]
    third = explain_cli.simulate_batch(
        _pods(make_pod, [10, 10, 10, 10]), nodes=[make_node("a", count=3, gib=16)], pods=[], now=NOW
    )
    assert third is not None and third.unplaced == 1
    (verdict,) = third.landings[3].verdicts
    assert [str(c) for c in verdict.codes] == ["FRAGMENTED"]  # 6 + 6 + 6 free, 10 asked


def test_admission_mutations_apply_before_placement(make_node: Factory, make_pod: Factory) -> None:
    # GPU101 pins gpu-mem pods to the configured isolating mode (cgpu): the share node is never used
    nodes = [make_node("plain", mode="share"), make_node("iso", mode="cgpu")]
    result = explain_cli.simulate_batch(_pods(make_pod, [4]), nodes=nodes, pods=[], now=NOW)
    assert result is not None and result.landings[0].node == "iso"


def test_a_denied_pod_is_reported_and_not_placed(make_node: Factory, make_pod: Factory) -> None:
    bad = make_pod("bad", mem=4)
    bad["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    result = explain_cli.simulate_batch([bad], nodes=[make_node("a")], pods=[], now=NOW)
    assert result is not None and result.landings[0].denied.startswith("GPU002") and not result.landings[0].placed


def test_workloads_become_their_replicas(make_pod: Factory) -> None:
    template = make_pod("x", mem=2)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "team-a"},
        "spec": {"replicas": 3, "template": {"metadata": {"labels": {"app": "web"}}, "spec": template["spec"]}},
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {"template": {"spec": template["spec"]}},
    }
    pods = simulate.expand([deployment, job, {"kind": "Service", "metadata": {"name": "svc"}}])
    assert [p["metadata"]["name"] for p in pods] == ["web-0", "web-1", "web-2", "train-0"]
    assert pods[0]["metadata"]["labels"] == {"app": "web"}


def test_add_nodes_finds_the_fewest_nodes_of_the_kind(make_node: Factory, make_pod: Factory) -> None:
    # 10 pods of 8 GiB; one 2 x 16 GiB node holds 4, the template (1 x 16 GiB) holds 2 each: 3 more
    template = make_node("tmpl", count=1, gib=16)
    result = explain_cli.simulate_batch(
        _pods(make_pod, [8] * 10), nodes=[make_node("a", count=2, gib=16)], pods=[], now=NOW, templates=[template]
    )
    assert result is not None and result.added == 3 and result.unplaced == 0
    assert sorted({landing.node for landing in result.landings}) == ["a", "tmpl-added-1", "tmpl-added-2", "tmpl-added-3"]
    too_small = explain_cli.simulate_batch(_pods(make_pod, [20]), nodes=[], pods=[], now=NOW, templates=[template])
    assert too_small is None


def test_the_command_on_a_snapshot(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], make_node: Factory, make_pod: Factory
) -> None:
    snap = tmp_path / "snap.json"
    snap.write_text(snapshot.dumps(snapshot.take([make_node("a", count=2, gib=16)], [], now=NOW), as_json=True))
    manifests = tmp_path / "batch.yaml"
    manifests.write_text(yaml.safe_dump_all(_pods(make_pod, [8, 8, 8, 8, 8])))
    status = cli.main(["simulate", "-f", str(manifests), "--snapshot", str(snap), "-o", "json"])
    document = json.loads(capsys.readouterr().out)
    assert status == 1  # one does not fit
    assert [p["node"] for p in document["placements"]] == ["a", "a", "a", "a", None]
    assert [n["reasons"][0]["code"] for n in document["placements"][4]["nodes"]] == ["INSUFFICIENT_MEMORY"]
    assert document["cards"]["usedGPU"] == 32
    status = cli.main(["simulate", "-f", str(manifests), "--snapshot", str(snap)])
    text = capsys.readouterr().out
    assert "team-a/p4 does not fit:" in text and "INSUFFICIENT_MEMORY (1 node): a" in text
    assert "Allocated/Total GPU Memory In Cluster:" in text
