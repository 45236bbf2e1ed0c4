"""defrag: plans that free whole cards or make room for a pod, moving only controller-owned pods within
their PodDisruptionBudgets, and the one-pod-at-a-time eviction that stops on the first surprise."""

from __future__ import annotations

import copy
import pathlib
from collections.abc import Callable
from typing import Any

import pytest

from webhook import cli
from webhook.explain import analysis, defrag, snapshot
from webhook.explain import cli as explain_cli
from webhook.kube import errors as kube_errors

NOW = 1_800_000_000.0
Factory = Callable[..., dict[str, Any]]


def _plan(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], **kwargs: Any) -> defrag.Plan:
    return defrag.plan(analysis.Cluster(nodes, pods, now=NOW), **kwargs)


def _scattered(
    make_node: Factory, make_placed: Factory, *, owner: str | None = "web-rs"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Two 2 x 16 GiB nodes: a has 4 GiB on GPU0 and 8 on GPU1; b has 10 GiB on GPU0, GPU1 empty."""
    nodes = [make_node("a", count=2), make_node("b", count=2)]
    pods = [
        make_placed("small", node_name="a", card=0, mem=4, owner=owner),
        make_placed("mid", node_name="a", card=1, mem=8, owner=owner),
        make_placed("big", node_name="b", card=0, mem=10, owner=owner),
    ]
    for item in pods:
        item["metadata"]["labels"] = {"app": "web"}
    return nodes, pods


def test_whole_cards_are_freed_by_moving_the_smallest_holders(make_node: Factory, make_placed: Factory) -> None:
    nodes, pods = _scattered(make_node, make_placed)
    plan = _plan(nodes, pods)
    assert [(m.pod, m.node, m.cards, m.to_node, m.to_cards) for m in plan.moves] == [
        ("team-a/small", "a", (0,), "a", (1,)),  # binpack: the fullest card that fits, never the one being freed
    ]
    assert plan.freed == (("a", (0,)),)
    assert all(m.owner == "ReplicaSet/web-rs" for m in plan.moves)


def test_pods_no_controller_recreates_are_never_moved(make_node: Factory, make_placed: Factory) -> None:
    nodes, pods = _scattered(make_node, make_placed, owner=None)
    plan = _plan(nodes, pods)
    assert plan.moves == () and plan.freed == ()
    assert any("has no controller that would recreate it" in reason for reason in plan.skipped)


def test_a_budget_out_of_disruptions_blocks_the_move(make_node: Factory, make_placed: Factory) -> None:
    nodes, pods = _scattered(make_node, make_placed)
    pdb: dict[str, Any] = {
        "metadata": {"name": "web", "namespace": "team-a"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "minAvailable": 3},
        "status": {"disruptionsAllowed": 0},
    }
    plan = _plan(nodes, pods, pdbs=[pdb])
    assert plan.moves == ()
    assert any("PodDisruptionBudget team-a/web allows no further disruption now" in reason for reason in plan.skipped)
    allowing = copy.deepcopy(pdb)
    allowing["status"]["disruptionsAllowed"] = 1
    assert len(_plan(nodes, pods, pdbs=[allowing]).moves) == 1
    other_labels = copy.deepcopy(pdb)
    other_labels["spec"]["selector"] = {"matchLabels": {"app": "db"}}
    assert len(_plan(nodes, pods, pdbs=[other_labels]).moves) == 1


def test_room_for_a_pod_takes_the_fewest_moves(make_node: Factory, make_pod: Factory, make_placed: Factory) -> None:
    # frag: 3 x 16 GiB at 10 + 12 + 12; b: 16 GiB with 6 used. A 14 GiB pod fits neither; moving
    # busy-0 (10 GiB, the fewest GiB that free enough of one card) to b makes room on frag GPU0.
    nodes = [make_node("frag", count=3), make_node("b", count=1)]
    pods = [make_placed(f"busy-{i}", node_name="frag", card=i, mem=mem, owner="rs") for i, mem in enumerate((10, 12, 12))]
    pods.append(make_placed("other", node_name="b", card=0, mem=6))
    plan = _plan(nodes, pods, target=make_pod("want-14", mem=14))
    assert [(m.pod, m.to_node, m.to_cards) for m in plan.moves] == [("team-a/busy-0", "b", (0,))]
    assert plan.freed == (("frag", (0,)),) and plan.target_node == "frag"
    assert "room for team-a/want-14" in plan.goal


def test_room_for_a_pod_that_already_fits_needs_no_move(make_node: Factory, make_pod: Factory) -> None:
    plan = _plan([make_node("a")], [], target=make_pod("p", mem=4))
    assert plan.moves == () and plan.target_node == "a"


class FakeClient:
    """Just enough of the apiserver for one eviction: GET pod, list pods, POST eviction."""

    def __init__(self, pods: list[dict[str, Any]], *, refuse: bool = False, replacement: dict[str, Any] | None = None) -> None:
        self.pods = pods
        self.refuse = refuse
        self.replacement = replacement
        self.evicted: list[str] = []

    def request(self, method: str, path: str, *, body: Any = None, **_: Any) -> dict[str, Any]:
        name = path.split("/")[6]
        if method == "POST":
            if self.refuse:
                raise kube_errors.KubeError("Cannot evict pod as it would violate the pod's disruption budget.", status=429)
            self.evicted.append(name)
            self.pods = [p for p in self.pods if p["metadata"]["name"] != name]
            if self.replacement is not None:
                self.pods.append(self.replacement)
            return {}
        for item in self.pods:
            if item["metadata"]["name"] == name:
                return item
        raise kube_errors.NotFound("not found", status=404)

    def list(self, path: str, **_: Any) -> tuple[list[dict[str, Any]], str]:
        return list(self.pods), "1"


def _move(pod: dict[str, Any]) -> defrag.Move:
    return defrag.Move(
        namespace="team-a",
        name=pod["metadata"]["name"],
        uid=pod["metadata"]["uid"],
        owner="ReplicaSet/rs",
        owner_uid="rs-rs",
        node="a",
        cards=(0,),
        memory_gib=4,
        to_node="a",
        to_cards=(1,),
    )


def _apply(client: FakeClient, move: defrag.Move, *, timeout: float = 5.0) -> str:
    ticks = iter(range(1000))
    return explain_cli.apply_move(
        client,  # type: ignore[arg-type]
        move,
        freed=[("a", (0,))],
        timeout=timeout,
        clock=lambda: float(next(ticks)),
        sleep=lambda _: None,
    )


def test_apply_evicts_and_waits_for_the_replacement(make_placed: Factory) -> None:
    old = make_placed("small", node_name="a", card=0, mem=4, owner="rs")
    new = make_placed("small-2", node_name="a", card=1, mem=4, owner="rs")
    client = FakeClient([old], replacement=new)
    assert _apply(client, _move(old)) == ""
    assert client.evicted == ["small"]


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("refused", "the eviction was refused"),
        ("back-on-freed-card", "landed on the card being freed"),
        ("never-scheduled", "no replacement was scheduled within"),
        ("changed", "the pod changed since the plan was made"),
    ],
)
def test_apply_stops_on_the_first_surprise(make_placed: Factory, setup: str, expected: str) -> None:
    old = make_placed("small", node_name="a", card=0, mem=4, owner="rs")
    replacement = {
        "back-on-freed-card": make_placed("small-2", node_name="a", card=0, mem=4, owner="rs"),
        "never-scheduled": None,
    }.get(setup, make_placed("small-2", node_name="a", card=1, mem=4, owner="rs"))
    client = FakeClient([old], refuse=setup == "refused", replacement=replacement)
    move = _move(old)
    if setup == "changed":
        move = defrag.Move(**{**move.__dict__, "node": "elsewhere"})
    assert expected in _apply(client, move)
    if setup in ("refused", "changed"):
        assert client.evicted == []


def test_the_plan_command_prints_moves_and_freed_cards(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], make_node: Factory, make_placed: Factory
) -> None:
    nodes, pods = _scattered(make_node, make_placed)
    path = tmp_path / "snap.json"
    path.write_text(snapshot.dumps(snapshot.take(nodes, pods, now=NOW), as_json=True))
    assert cli.main(["defrag", "plan", "--snapshot", str(path)]) == 0
    out = capsys.readouterr().out
    assert "team-a/small  ReplicaSet/web-rs  4    a GPU0  a GPU1" in out and "Cards freed: a GPU0" in out
    assert cli.main(["defrag", "apply", "--snapshot", str(path), "--yes"]) == 2  # apply is for the live cluster
