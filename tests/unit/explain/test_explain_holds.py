"""explain and simulate show the preempt verb's hold records (whom each holds for, what it evicted,
whether it still holds the card) and judge pods on the held state, as filter and bind do: a pod of
lower or equal priority does not get the card held for a preemptor, a pod above it does."""

from __future__ import annotations

import copy
import json
from typing import Any

from tests.unit.extender import conftest
from tests.unit.extender.test_extender_preempt_hold import NOW, _bound, _lease, _pending, _record
from webhook.explain import cli as explain_cli
from webhook.explain import render, snapshot

NODE = conftest.node("n", count=2, gib=16)


def _pods(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    """Card 0 of n half freed (a0 gone, c0 Terminating), card 1 full (b1, d1); the preemptor boss pending."""
    return [_bound("c0", card=0, deleting=True), _bound("b1", card=1), _bound("d1", card=1), _pending(), *extra]


def _explain(pod: dict[str, Any], leases: list[dict[str, Any]]) -> Any:
    return explain_cli.explain_pod(pod, nodes=[NODE], pods=_pods(pod), now=NOW + 10, leases=leases)


def test_explain_shows_the_hold_and_refuses_the_held_card_to_a_lower_pod() -> None:
    late = _pending("late", gib=8, priority=0)
    report = _explain(late, [_lease(_record())])
    (verdict,) = report.nodes
    assert not verdict.fits
    assert "held for team-a/boss, which preempted here" in verdict.reasons[-1].message
    (hold,) = report.holds
    assert (hold.node, hold.pod, hold.priority, hold.standing, hold.cards) == ("n", "team-a/boss", 1000, True, (0,))
    assert hold.victims == ("team-a/c0", "uid-a0 (gone)")
    text = render.render(report, output="table", now=NOW + 10)
    assert (
        "Holds:" in text
        and "n GPU0: for team-a/boss (priority 1000), which preempted team-a/c0, uid-a0 (gone); recorded 10 s ago; holds the card"
        in text
    )
    document = json.loads(render.render(report, output="json"))
    assert document["holds"] == [
        {
            "node": "n",
            "pod": "team-a/boss",
            "priority": 1000,
            "victims": ["team-a/c0", "uid-a0 (gone)"],
            "recordedAt": NOW,
            "standing": True,
            "cards": [0],
        }
    ]


def test_without_a_record_nothing_is_held_and_the_report_is_unchanged() -> None:
    late = _pending("late", gib=8, priority=0)
    report = _explain(late, [])
    (verdict,) = report.nodes
    assert verdict.fits and verdict.cards == (0,) and report.holds == ()
    assert "holds" not in json.loads(render.render(report, output="json"))
    assert "Holds:" not in render.render(report, output="table")


def test_a_pod_above_the_preemptor_is_not_held_back_but_sees_the_record() -> None:
    vip = _pending("vip", gib=8, priority=2000)
    report = _explain(vip, [_lease(_record())])
    (verdict,) = report.nodes
    assert verdict.fits
    assert [h.pod for h in report.holds] == ["team-a/boss"]


def test_a_lapsed_record_is_shown_as_holding_nothing() -> None:
    late = _pending("late", gib=8, priority=0)
    report = _explain(late, [_lease(_record(at=NOW - 400))])  # older than HOLD_MAX_S
    (verdict,) = report.nodes
    assert verdict.fits
    (hold,) = report.holds
    assert not hold.standing and hold.cards == ()
    assert "lapsed: holds nothing" in render.render(report, output="table", now=NOW + 10)


def _manifest(name: str, *, priority: int) -> dict[str, Any]:
    pod = copy.deepcopy(_pending(name, gib=8, priority=priority))
    for key in ("uid", "resourceVersion", "creationTimestamp"):
        pod["metadata"].pop(key, None)
    pod.pop("status", None)
    return pod


def test_simulate_honours_and_shows_the_hold() -> None:
    leases = [_lease(_record())]
    held = explain_cli.simulate_batch([_manifest("late", priority=0)], nodes=[NODE], pods=_pods(), now=NOW + 10, leases=leases)
    assert held is not None
    (landing,) = held.landings
    assert not landing.placed
    assert any("held for team-a/boss" in r.message for v in landing.verdicts for r in v.reasons)
    assert [h.pod for h in held.holds] == ["team-a/boss"]
    text = explain_cli.render_simulation(held, output="table", now=NOW + 10)
    assert "Holds:" in text and "for team-a/boss (priority 1000)" in text
    assert json.loads(explain_cli.render_simulation(held, output="json"))["holds"][0]["pod"] == "team-a/boss"
    free = explain_cli.simulate_batch([_manifest("late", priority=0)], nodes=[NODE], pods=_pods(), now=NOW + 10, leases=[])
    assert free is not None and free.landings[0].placed and free.landings[0].cards == (0,)
    assert "holds" not in json.loads(explain_cli.render_simulation(free, output="json"))


def test_a_snapshot_keeps_the_hold_lease() -> None:
    taken = snapshot.take([NODE], _pods(), now=NOW, leases=[_lease(_record())])
    assert [lease["metadata"]["name"] for lease in taken.leases] == ["gpu-hold.n"]
    report = explain_cli.explain_pod(
        _pending("late", gib=8, priority=0), nodes=[NODE], pods=_pods(), now=NOW + 10, leases=taken.leases
    )
    assert [h.pod for h in report.holds] == ["team-a/boss"]
