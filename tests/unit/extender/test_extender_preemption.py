"""Card-aware preemption as a pure function: the victims that free one card, and the nomination hold."""

from __future__ import annotations

from typing import Any

from policies.gpu import allocation, cardrequest, cards
from tests.unit.extender import conftest
from webhook.extender import placement, preemption

Factory = Any


def _state(node: dict[str, Any], held: list[tuple[str, int, int]], *, whole: bool = False, bound: bool = True) -> cards.NodeState:
    """A node holding `(uid, card, GiB)` allocations (whole cards when `whole`)."""
    name = node["metadata"]["name"]
    return cards.occupy(
        cards.node_cards(node),
        [
            allocation.Allocation(
                uid=uid, namespace="team-a", name=uid, node=name, cards=(card,), memory_gib=gib, whole=whole, bound=bound
            )
            for uid, card, gib in held
        ],
    )


def _known(priorities: dict[str, int], **extra: Any) -> dict[str, preemption.Pod]:
    return {
        uid: preemption.Pod(uid=uid, key=f"team-a/{uid}", priority=priority, namespace="team-a", **extra.get(uid, {}))
        for uid, priority in priorities.items()
    }


TWO_CARDS = [("a0", 0, 8), ("b1", 1, 8), ("c0", 0, 8), ("d1", 1, 8)]  # two 16 GiB cards, two 8 GiB pods on each


def test_the_two_card_example_frees_one_card_not_one_pod_on_each() -> None:
    state = _state(conftest.node("n", count=2, gib=16), TWO_CARDS)
    choice = preemption.select(
        cardrequest.Request(memory_gib=16), state, priority=1000, known=_known({"a0": 0, "b1": 0, "c0": 0, "d1": 0})
    )
    assert choice is not None
    assert len(choice.victims) == 2
    card = choice.cards[0]
    assert {v.uid for v in choice.victims} == {uid for uid, c, _ in TWO_CARDS if c == card}
    # and the pod really fits there once they are gone
    after = cards.occupy(state.node, [a for a in state.allocations if a.uid not in choice.uids])
    assert placement.evaluate(cardrequest.Request(memory_gib=16), after).fits


def test_the_fewest_victims_win_then_the_lowest_priorities() -> None:
    # card 0: one 16 GiB pod of priority 500; card 1: two 8 GiB pods of priority 0
    state = _state(conftest.node("n", count=2, gib=16), [("big", 0, 16), ("s1", 1, 8), ("s2", 1, 8)])
    choice = preemption.select(
        cardrequest.Request(memory_gib=16), state, priority=1000, known=_known({"big": 500, "s1": 0, "s2": 0})
    )
    assert choice is not None and choice.uids == ("big",)
    # equal counts: the card whose victims have the lower priorities
    state = _state(conftest.node("n", count=2, gib=16), [("hi", 0, 16), ("lo", 1, 16)])
    choice = preemption.select(cardrequest.Request(memory_gib=16), state, priority=1000, known=_known({"hi": 500, "lo": 10}))
    assert choice is not None and choice.uids == ("lo",) and choice.cards == (1,)


def test_mixed_priorities_on_one_card_evict_only_the_lower_ones() -> None:
    # card 0: 8 GiB of priority 2000 (above the preemptor) and 8 GiB of priority 0; card 1 the same mix reversed in size
    state = _state(conftest.node("n", count=2, gib=16), [("keep", 0, 8), ("go", 0, 8), ("keep2", 1, 12), ("go2", 1, 4)])
    known = _known({"keep": 2000, "go": 0, "keep2": 2000, "go2": 0})
    choice = preemption.select(cardrequest.Request(memory_gib=8), state, priority=1000, known=known)
    assert choice is not None and choice.uids == ("go",) and choice.cards == (0,)
    # 10 GiB fits on neither card without evicting a higher-priority pod: the node is dropped
    assert preemption.select(cardrequest.Request(memory_gib=10), state, priority=1000, known=known) is None


def test_equal_priority_pods_are_never_victims() -> None:
    state = _state(conftest.node("n", count=2, gib=16), TWO_CARDS)
    assert (
        preemption.select(
            cardrequest.Request(memory_gib=16), state, priority=0, known=_known(dict.fromkeys(("a0", "b1", "c0", "d1"), 0))
        )
        is None
    )
    # one equal-priority pod per card: no card can be freed
    known = _known({"a0": 1000, "b1": 1000, "c0": 0, "d1": 0})
    assert preemption.select(cardrequest.Request(memory_gib=16), state, priority=1000, known=known) is None


def test_a_pdb_breaks_a_tie_but_not_a_smaller_set() -> None:
    state = _state(conftest.node("n", count=2, gib=16), [("guarded", 0, 16), ("free", 1, 16)])
    known = _known({"guarded": 0, "free": 0}, guarded={"labels": {"app": "db"}})
    budget = preemption.budgets_of(
        [
            {
                "metadata": {"name": "db", "namespace": "team-a"},
                "spec": {"selector": {"matchLabels": {"app": "db"}}},
                "status": {"disruptionsAllowed": 0},
            }
        ]
    )
    choice = preemption.select(cardrequest.Request(memory_gib=16), state, priority=1000, known=known, budgets=budget)
    assert choice is not None and choice.uids == ("free",) and choice.violations == 0
    # without the budget the tie goes to the lower card index
    choice = preemption.select(cardrequest.Request(memory_gib=16), state, priority=1000, known=known)
    assert choice is not None and choice.uids == ("guarded",)
    # the only way is through the budget: chosen, and the violation reported to kube-scheduler
    state = _state(conftest.node("n", count=1, gib=16), [("guarded", 0, 16)])
    choice = preemption.select(cardrequest.Request(memory_gib=16), state, priority=1000, known=known, budgets=budget)
    assert choice is not None and choice.uids == ("guarded",) and choice.violations == 1


def test_topology_pods_free_a_whole_card_set() -> None:
    node = conftest.node("t", mode="topology", count=4)
    # each card held whole by one pod: cards 0 and 1 priority 0, card 2 priority 5000, card 3 priority 10
    state = _state(node, [("w0", 0, 0), ("w1", 1, 0), ("high", 2, 0), ("w3", 3, 0)], whole=True)
    known = _known({"w0": 0, "w1": 0, "high": 5000, "w3": 10})
    choice = preemption.select(cardrequest.Request(cards=2), state, priority=1000, known=known)
    assert choice is not None and set(choice.uids) == {"w0", "w1"} and set(choice.cards) == {0, 1}
    # three cards: 0, 1 and 3 (card 2's pod outranks the preemptor); four: no such set exists
    choice = preemption.select(cardrequest.Request(cards=3), state, priority=1000, known=known)
    assert choice is not None and set(choice.cards) == {0, 1, 3}
    assert preemption.select(cardrequest.Request(cards=4), state, priority=1000, known=known) is None
    # a free card counts: one victim is enough for two cards
    state = _state(node, [("w0", 0, 0), ("high", 2, 0), ("w3", 3, 0)], whole=True)
    choice = preemption.select(cardrequest.Request(cards=2), state, priority=1000, known=known)
    assert choice is not None and len(choice.victims) == 1 and choice.uids[0] in {"w0", "w3"}


def test_no_set_exists_when_the_pod_fits_now_or_never() -> None:
    state = _state(conftest.node("n", count=2, gib=16), [("a0", 0, 8)])
    known = _known({"a0": 0})
    assert preemption.select(cardrequest.Request(memory_gib=8), state, priority=1000, known=known) is None  # fits on card 1 now
    assert preemption.select(cardrequest.Request(memory_gib=32), state, priority=1000, known=known) is None  # no card that large


def test_pods_on_other_cards_and_pods_not_known_are_never_added() -> None:
    # card 0: a low pod of 8 GiB and an in-flight reservation (not bound) of 8 GiB; card 1: a pod the extender does not know
    node = conftest.node("n", count=2, gib=16)
    bound = _state(node, [("low", 0, 8), ("stranger", 1, 16)])
    flying = allocation.Allocation(uid="fly", namespace="team-a", name="fly", node="n", cards=(0,), memory_gib=8)
    state = cards.occupy(bound.node, [*bound.allocations, flying])
    known = _known({"low": 0, "fly": 0})  # "stranger" (a pod of no known priority) is not in the cache's pods
    # 16 GiB: card 0 needs "fly" gone (not bound: not a victim), card 1 needs "stranger" (unknown): dropped
    assert preemption.select(cardrequest.Request(memory_gib=16), state, priority=1000, known=known) is None
    # 8 GiB: only "low" (12 GiB) frees enough; "other" (2 GiB) beside it is not added
    state = _state(node, [("low", 0, 12), ("other", 0, 2), ("stranger", 1, 16)])
    choice = preemption.select(cardrequest.Request(memory_gib=8), state, priority=1000, known=_known({"low": 0, "other": 0}))
    assert choice is not None and choice.uids == ("low",)


def test_victims_come_most_important_first_for_kube_scheduler() -> None:
    state = _state(conftest.node("n", count=1, gib=16), [("p5", 0, 8), ("p9", 0, 8)])
    choice = preemption.select(cardrequest.Request(memory_gib=16), state, priority=1000, known=_known({"p5": 5, "p9": 9}))
    assert choice is not None and choice.uids == ("p9", "p5")


def test_a_low_priority_tenant_cannot_evict_higher_pods_or_overcommit() -> None:
    # the attacker asks for a whole 16 GiB card at priority 10 on a node whose pods are all priority 10 or above
    state = _state(conftest.node("n", count=2, gib=16), TWO_CARDS)
    known = _known({"a0": 10, "b1": 100, "c0": 100, "d1": 10})
    assert preemption.select(cardrequest.Request(memory_gib=16), state, priority=10, known=known) is None
    # with priority 50 it may evict only a0 and d1, which sit on different cards: no card frees, nothing is chosen
    assert preemption.select(cardrequest.Request(memory_gib=16), state, priority=50, known=known) is None
    # and every choice the function makes is one that fits without over-commit
    for asked in range(1, 17):
        choice = preemption.select(
            cardrequest.Request(memory_gib=asked), state, priority=1000, known=_known(dict.fromkeys(("a0", "b1", "c0", "d1"), 0))
        )
        if choice is not None:
            after = cards.occupy(state.node, [a for a in state.allocations if a.uid not in choice.uids])
            card = after.card(choice.cards[0])
            assert card is not None and card.memory_used + asked <= card.card.memory_gib


def test_a_nominee_holds_the_freed_card_against_lower_and_equal_pods() -> None:
    # after the preemption: the victims on card 1 are being deleted, the 16 GiB preemptor is nominated
    state = _state(conftest.node("n", count=2, gib=16), [("a0", 0, 8), ("c0", 0, 8)])
    nominee = preemption.Nominee(
        uid="boss", namespace="team-a", name="boss", priority=1000, request=cardrequest.Request(memory_gib=16)
    )
    held = preemption.held(state, preemption.holders([nominee], priority=0, uid="late"))
    assert not placement.evaluate(cardrequest.Request(memory_gib=8), held).fits
    assert not placement.evaluate(
        cardrequest.Request(memory_gib=8), preemption.held(state, preemption.holders([nominee], priority=1000, uid="late"))
    ).fits
    # a higher-priority pod is not held back, and the nominee itself is not held against itself
    assert preemption.holders([nominee], priority=2000, uid="late") == []
    assert preemption.holders([nominee], priority=0, uid="boss") == []


def test_a_nominee_holds_a_card_whose_victims_are_still_terminating() -> None:
    # one victim gone, the other still terminating on card 1: the 8 GiB freed must not go to a low pod
    state = _state(conftest.node("n", count=2, gib=16), [("a0", 0, 8), ("c0", 0, 8), ("d1", 1, 8)])
    nominee = preemption.Nominee(
        uid="boss", namespace="team-a", name="boss", priority=1000, request=cardrequest.Request(memory_gib=16)
    )
    assert placement.evaluate(cardrequest.Request(memory_gib=8), state).fits  # without the hold, card 1 has room
    held = preemption.held(state, [nominee], going=frozenset({"d1"}))
    assert not placement.evaluate(cardrequest.Request(memory_gib=8), held).fits
    # a nominee that could not fit even after its victims leave holds nothing
    huge = preemption.Nominee(
        uid="huge", namespace="team-a", name="huge", priority=1000, request=cardrequest.Request(memory_gib=32)
    )
    assert preemption.held(state, [huge], going=frozenset({"d1"})).allocations == state.allocations


def test_nominated_node_only_for_pending_pods() -> None:
    pod = conftest.pod("p", mem=4)
    pod["status"]["nominatedNodeName"] = "n"
    assert preemption.nominated_node(pod) == "n"
    assert preemption.nominated_node({**pod, "spec": {**pod["spec"], "nodeName": "n"}}) == ""
    assert preemption.nominated_node({**pod, "metadata": {**pod["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}) == ""
    assert preemption.nominated_node({**pod, "status": {"phase": "Failed", "nominatedNodeName": "n"}}) == ""
