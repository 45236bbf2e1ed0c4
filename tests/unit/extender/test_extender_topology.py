"""The topology annotation: its shape, link levels, and the best-connected set of cards."""

from __future__ import annotations

import json

import pytest

from policies.gpu import inventory
from webhook.extender import topology

# Two NVLink islands {0,1,2,3} and {4,5,6,7} (NV2 inside, SYS across), like a DGX-1 half each.
ISLANDS = [(a, b, "NV2" if (a < 4) == (b < 4) else "SYS") for a in range(8) for b in range(a + 1, 8)]


def test_the_annotation_round_trips_through_render_and_parse() -> None:
    text = inventory.encode_topology([(1, 0, "nv2"), (0, 2, "PIX")])
    assert json.loads(text) == {"links": [[0, 1, "NV2"], [0, 2, "PIX"]]}
    parsed = inventory.read_topology(text)
    assert parsed.level(1, 0) == "NV2" and parsed.level(2, 0) == "PIX" and parsed.level(1, 2) is None


@pytest.mark.parametrize(
    ("level", "score"),
    [("NV12", 120), ("NV2", 20), ("NV1", 10), ("PIX", 5), ("PXB", 4), ("PHB", 3), ("NODE", 2), ("SYS", 1), ("X", 0), (None, 0)],
)
def test_levels_rank_nvlink_above_every_pcie_path(level: str | None, score: int) -> None:
    assert inventory.level_score(level) == score


@pytest.mark.parametrize("text", [None, "", "not json", "[]", '{"links": 3}', '{"links": [[0, 0, "NV1"]]}'])
def test_a_missing_or_malformed_annotation_reads_as_no_topology(text: str | None) -> None:
    assert not inventory.read_topology(text).known


def test_one_bad_triple_does_not_hide_the_good_ones() -> None:
    parsed = inventory.read_topology('{"links": [[0, 1, "NV1"], [0, "x", "PIX"], [1, 2, "WARP"], [2, 3, "PHB"]]}')
    assert parsed.links == {frozenset({0, 1}): "NV1", frozenset({2, 3}): "PHB"}


def test_four_cards_come_from_one_nvlink_island() -> None:
    links = inventory.read_topology(inventory.encode_topology(ISLANDS))
    assert topology.best_set(range(8), 4, links) == (0, 1, 2, 3)
    # With 1 taken in the first island, the second island is the only fully NVLinked set.
    assert topology.best_set([0, 2, 3, 4, 5, 6, 7], 4, links) == (4, 5, 6, 7)


def test_two_cards_prefer_an_nvlink_pair_over_lower_indices() -> None:
    links = inventory.read_topology(
        inventory.encode_topology([(0, 1, "SYS"), (0, 2, "SYS"), (0, 3, "SYS"), (1, 2, "PIX"), (1, 3, "SYS"), (2, 3, "NV2")])
    )
    assert topology.best_set([0, 1, 2, 3], 2, links) == (2, 3)


def test_one_card_takes_the_least_connected_card_keeping_pairs_whole() -> None:
    links = inventory.read_topology(inventory.encode_topology([(0, 1, "NV2"), (0, 2, "SYS"), (1, 2, "SYS")]))
    assert topology.best_set([0, 1, 2], 1, links) == (2,)


def test_without_topology_the_lowest_free_indices_win() -> None:
    assert topology.best_set([5, 3, 7, 1], 2, inventory.EMPTY_TOPOLOGY) == (1, 3)


def test_too_few_free_cards_give_no_set() -> None:
    assert topology.best_set([0, 1], 3, inventory.EMPTY_TOPOLOGY) is None


def test_big_nodes_fall_back_to_a_greedy_search_that_still_keeps_islands() -> None:
    islands = [(a, b, "NV4" if a // 8 == b // 8 else "SYS") for a in range(24) for b in range(a + 1, 24)]
    links = inventory.read_topology(inventory.encode_topology(islands))
    chosen = topology.best_set(range(24), 8, links)
    assert chosen is not None and len({card // 8 for card in chosen}) == 1
