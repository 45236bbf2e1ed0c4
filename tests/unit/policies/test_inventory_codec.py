"""The inventory and topology annotations: one codec, round trips, and a clear error for bad input."""

from __future__ import annotations

import json

import pytest

from policies import gpu
from policies.gpu import inventory

T4 = inventory.Card(index=0, memory_mib=15360, uuid="GPU-0000", name="Tesla-T4")
V100 = inventory.Card(index=1, memory_mib=32510, uuid="GPU-0001", name="Tesla-V100-SXM2-32GB")


# --- inventory ---


@pytest.mark.parametrize(
    "cards",
    [
        (),
        (T4,),
        (T4, V100),
        (inventory.Card(index=7, memory_mib=0),),  # name and uuid unknown, no memory
    ],
)
def test_an_inventory_round_trips(cards: tuple[inventory.Card, ...]) -> None:
    text = inventory.encode_inventory(cards)
    assert inventory.decode_inventory(text) == cards
    assert inventory.read_inventory(text) == cards


def test_the_inventory_is_written_compact_with_sorted_keys() -> None:
    assert inventory.encode_inventory([T4]) == '[{"index":0,"memoryMiB":15360,"name":"Tesla-T4","uuid":"GPU-0000"}]'


def test_decoded_cards_are_sorted_by_index_and_know_model_and_memory() -> None:
    text = '[{"index":1,"memoryMiB":23028,"name":"NVIDIA-A10"},{"index":0,"memoryMiB":15360}]'
    cards = inventory.decode_inventory(text)
    assert [(c.index, c.model, c.memory_mib, c.memory_gib, c.uuid) for c in cards] == [
        (0, "", 15360, 15, ""),
        (1, "NVIDIA-A10", 23028, 22, ""),  # GiB rounded down: a pod must fit in the real card
    ]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("nope", "not JSON"),
        ("{}", "expected a JSON list of cards, got dict"),
        ("[3]", "card [0]: expected an object, got int"),
        ('[{"memoryMiB": 1}]', "card [0]: index must be a non-negative integer, got None"),
        ('[{"index": -1, "memoryMiB": 1}]', "card [0]: index must be a non-negative integer, got -1"),
        ('[{"index": true, "memoryMiB": 1}]', "card [0]: index must be a non-negative integer, got True"),
        ('[{"index": 0}]', "card [0]: memoryMiB must be a non-negative integer, got None"),
        ('[{"index": 0, "memoryMiB": 1.5}]', "card [0]: memoryMiB must be a non-negative integer, got 1.5"),
        ('[{"index": 0, "memoryMiB": 1}, {"index": 0, "memoryMiB": 2}]', "card [1]: index 0 is listed twice"),
        ('[{"index": 0, "memoryMiB": 1, "name": null}]', "card [0]: name must be a string, got None"),
        ('[{"index": 0, "memoryMiB": 1, "uuid": 7}]', "card [0]: uuid must be a string, got 7"),
    ],
)
def test_a_malformed_inventory_is_a_clear_error_and_reads_as_none(text: str, said: str) -> None:
    with pytest.raises(gpu.AnnotationError) as raised:
        inventory.decode_inventory(text)
    assert str(raised.value).startswith(f"{gpu.INVENTORY_ANNOTATION}: {said}")
    assert "\n" not in str(raised.value)
    assert inventory.read_inventory(text) == ()


@pytest.mark.parametrize("text", [None, ""])
def test_a_missing_inventory_reads_as_none(text: str | None) -> None:
    assert inventory.read_inventory(text) == ()


# --- link levels ---


@pytest.mark.parametrize(
    ("code", "level"),
    [("NV2", "NV2"), ("nv12", "NV12"), (" pix ", "PIX"), ("NV99", "NV99"), ("sys", "SYS"), ("NODE", "NODE")],
)
def test_link_levels_are_normalised(code: str, level: str) -> None:
    assert inventory.link_level(code) == level
    assert inventory.is_level(code)


@pytest.mark.parametrize("code", ["NV0", "NV100", "NV01", "NV", "WARP", "", "PIX2"])
def test_an_unknown_link_level_is_refused(code: str) -> None:
    with pytest.raises(ValueError, match="unknown link level"):
        inventory.link_level(code)
    assert not inventory.is_level(code) and inventory.level_score(code) == inventory.UNKNOWN_SCORE


def test_nvlink_levels_are_written_from_a_link_count() -> None:
    assert inventory.nvlink_level(4) == "NV4" and inventory.nvlinks_of("NV4") == 4 and inventory.nvlinks_of("PIX") == 0
    with pytest.raises(ValueError, match="1 to 99 links, got 0"):
        inventory.nvlink_level(0)


# --- topology ---


@pytest.mark.parametrize(
    ("links", "written"),
    [
        ([], '{"links":[]}'),
        ([(1, 0, "nv2"), (0, 2, "PIX")], '{"links":[[0,1,"NV2"],[0,2,"PIX"]]}'),
        ([(3, 2, "SYS")], '{"links":[[2,3,"SYS"]]}'),
    ],
)
def test_a_topology_round_trips(links: list[tuple[int, int, str]], written: str) -> None:
    text = inventory.encode_topology(links)
    assert text == written
    decoded = inventory.decode_topology(text)
    assert decoded == inventory.read_topology(text)
    assert dict(decoded.links) == {frozenset((a, b)): level.upper() for a, b, level in links}


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("not json", "not JSON"),
        ("[]", 'expected a JSON object with a "links" list'),
        ('{"links": 3}', 'expected a JSON object with a "links" list'),
        ('{"links": [[0, 1]]}', "link [0]: expected [a, b, level], got [0, 1]"),
        ('{"links": [[0, 0, "NV1"]]}', "link [0]: expected two different card indices, got 0 and 0"),
        ('{"links": [[0, 1, "NV1"], [0, "x", "PIX"]]}', "link [1]: expected two different card indices, got 0 and 'x'"),
        ('{"links": [[1, 2, "WARP"]]}', "link [0]: unknown link level 'WARP'"),
    ],
)
def test_a_malformed_topology_is_a_clear_error(text: str, said: str) -> None:
    with pytest.raises(gpu.AnnotationError) as raised:
        inventory.decode_topology(text)
    assert str(raised.value).startswith(f"{gpu.TOPOLOGY_ANNOTATION}: {said}")


def test_the_lenient_reader_skips_bad_links_and_keeps_the_rest() -> None:
    text = '{"links": [[0, 1, "NV1"], [0, "x", "PIX"], [1, 2, "WARP"], [2, 3, "phb"]], "version": 1}'
    assert inventory.read_topology(text).links == {frozenset({0, 1}): "NV1", frozenset({2, 3}): "PHB"}
    assert inventory.read_topology("[]") is inventory.EMPTY_TOPOLOGY
    assert json.loads(inventory.encode_topology([(2, 3, "phb")])) == {"links": [[2, 3, "PHB"]]}
