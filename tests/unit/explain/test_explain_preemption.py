"""explain and simulate with priorities (issue 27): the extender's preempt verb's answer, and
PREEMPTION_IMPOSSIBLE where no card can be freed."""

from __future__ import annotations

from typing import Any

from tests.unit.explain import conftest
from webhook.explain import analysis, render, simulate

NOW = conftest.NOW


def _two_cards(*, priorities: dict[str, int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Two 16 GiB cards, a0 and c0 on card 0, b1 and d1 on card 1 (8 GiB each)."""
    pods = []
    for name, card in (("a0", 0), ("b1", 1), ("c0", 0), ("d1", 1)):
        placed = conftest.placed(name, node_name="n", card=card, mem=8)
        placed["spec"]["priority"] = priorities.get(name, 0)
        pods.append(placed)
    return [conftest.node("n", count=2, gib=16)], pods


def _pending(priority: int, mem: int = 16) -> dict[str, Any]:
    pod = conftest.pod("boss", mem=mem)
    pod["spec"]["priority"] = priority
    return pod


def test_explain_names_the_victims_on_one_card() -> None:
    nodes, pods = _two_cards(priorities={})
    report = analysis.explain(_pending(1000), cluster=analysis.Cluster(nodes, pods, now=NOW))
    [verdict] = report.nodes
    assert verdict.preemption is not None
    card = verdict.preemption.cards[0]
    expected = {"team-a/a0", "team-a/c0"} if card == 0 else {"team-a/b1", "team-a/d1"}
    assert {p.key for p in verdict.preemption.victims} == expected
    text = render.render(report, output="table")
    assert "Preemption: would make the pod fit by evicting" in text and f"n GPU{card}:" in text
    document = render.as_json(report)
    assert document["nodes"][0]["preemption"] == {
        "cards": [card],
        "victims": [p.key for p in verdict.preemption.victims],
        "pdbViolations": 0,
    }


def test_explain_says_preemption_impossible_when_every_card_holds_an_equal_or_higher_pod() -> None:
    nodes, pods = _two_cards(priorities={"a0": 1000, "d1": 1000})
    report = analysis.explain(_pending(1000), cluster=analysis.Cluster(nodes, pods, now=NOW))
    [verdict] = report.nodes
    assert verdict.preemption is None and verdict.codes[-1] == "PREEMPTION_IMPOSSIBLE"
    assert "PREEMPTION_IMPOSSIBLE" in render.render(report, output="table")


def test_simulate_lets_a_higher_pod_preempt_one_card_and_a_lower_one_wait() -> None:
    nodes, pods = _two_cards(priorities={})
    cluster = analysis.Cluster(nodes, pods, now=NOW)
    low = _pending(0, mem=16)
    low["metadata"]["name"] = "low"
    result = simulate.run([low, _pending(1000)], cluster=cluster)
    first, second = result.landings
    assert not first.placed and not first.preempted  # priority 0 evicts nobody
    assert second.placed and second.node == "n" and len(second.preempted) == 2
    card = second.cards[0]
    expected = {"team-a/a0", "team-a/c0"} if card == 0 else {"team-a/b1", "team-a/d1"}
    assert set(second.preempted) == expected
    assert [c.memory_used for c in result.states["n"].cards] == [16, 16]  # no over-commit after the preemption


def test_a_snapshot_keeps_what_preemption_reads() -> None:
    from webhook.explain import snapshot

    nodes, pods = _two_cards(priorities={"a0": 5})
    pods[0]["status"]["startTime"] = "2027-01-15T08:00:00Z"
    pending = _pending(1000)
    pending["spec"]["preemptionPolicy"] = "Never"
    pending["status"]["nominatedNodeName"] = "n"
    taken = snapshot.take(nodes, [*pods, pending], now=NOW)
    kept = {p["metadata"]["name"]: p for p in taken.pods}
    assert kept["a0"]["spec"]["priority"] == 5 and kept["a0"]["status"]["startTime"] == "2027-01-15T08:00:00Z"
    assert kept["boss"]["spec"]["preemptionPolicy"] == "Never" and kept["boss"]["status"]["nominatedNodeName"] == "n"
