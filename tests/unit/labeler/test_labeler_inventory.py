"""The inventory file that stands in for NVML: its shape, and one-line errors naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from policies.gpu import inventory as codec  # the GPU model's link levels; `inventory` is the labeler's
from webhook.labeler import inventory

DATA = Path(__file__).resolve().parents[2] / "data" / "labeler"


def test_the_shipped_v100_inventory_reads_as_eight_nvlinked_cards() -> None:
    inv = inventory.load(DATA / "v100x8.yaml")
    assert [card.index for card in inv.cards] == list(range(8))
    assert {card.name for card in inv.cards} == {"Tesla V100-SXM2-32GB"}
    assert inv.driver_version == "550.107.02"
    assert inv.cuda_version == "12.4"
    assert len(inv.links) == 28  # every pair of 8 cards
    assert inventory.Link(a=0, b=3, nvlinks=2) in inv.links


def test_a_minimal_inventory_needs_only_gpus() -> None:
    inv = inventory.parse({"gpus": [{"index": 0, "uuid": "GPU-a", "name": "Tesla T4", "memoryMiB": 15360}]}, source="t")
    assert inv == inventory.Inventory(cards=(inventory.Card(index=0, uuid="GPU-a", name="Tesla T4", memory_mib=15360),))


def test_cards_are_sorted_by_index_and_link_ends_ordered() -> None:
    inv = inventory.parse(
        {
            "gpus": [
                {"index": 1, "uuid": "GPU-b", "name": "T4", "memoryMiB": 1},
                {"index": 0, "uuid": "GPU-a", "name": "T4", "memoryMiB": 1},
            ],
            "topology": [[1, 0, "pix"]],
        },
        source="t",
    )
    assert [card.index for card in inv.cards] == [0, 1]
    assert inv.links == (inventory.Link(a=0, b=1, level=codec.Level.PIX),)
    assert inv.links[0].code == "PIX"


def test_a_numeric_driver_version_is_read_as_text() -> None:
    inv = inventory.parse({"gpus": [], "driverVersion": 550, "cudaVersion": 12.4}, source="t")
    assert (inv.driver_version, inv.cuda_version) == ("550", "12.4")


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([], "expected a mapping with a 'gpus' list"),
        ({"gpus": {}}, "expected a mapping with a 'gpus' list"),
        ({"gpus": ["x"]}, "gpus[0]: expected a mapping"),
        ({"gpus": [{"index": -1, "uuid": "u", "name": "n", "memoryMiB": 1}]}, "gpus[0].index"),
        ({"gpus": [{"index": True, "uuid": "u", "name": "n", "memoryMiB": 1}]}, "gpus[0].index"),
        ({"gpus": [{"index": 0, "uuid": "u", "name": "n", "memoryMiB": 0}]}, "gpus[0].memoryMiB"),
        ({"gpus": [{"index": 0, "uuid": "u", "name": "n", "memoryMiB": "16GB"}]}, "gpus[0].memoryMiB"),
        ({"gpus": [{"index": 0, "uuid": "", "name": "n", "memoryMiB": 1}]}, "gpus[0].uuid"),
        ({"gpus": [{"index": 0, "uuid": "u", "name": " ", "memoryMiB": 1}]}, "gpus[0].name"),
        (
            {
                "gpus": [
                    {"index": 0, "uuid": "u", "name": "n", "memoryMiB": 1},
                    {"index": 0, "uuid": "v", "name": "n", "memoryMiB": 1},
                ]
            },
            "duplicate card index",
        ),
        (
            {
                "gpus": [
                    {"index": 0, "uuid": "u", "name": "n", "memoryMiB": 1},
                    {"index": 1, "uuid": "u", "name": "n", "memoryMiB": 1},
                ]
            },
            "duplicate card uuid",
        ),
        ({"gpus": [{"index": 0, "uuid": "u", "name": "n", "memoryMiB": 1}], "topology": [[0, 1, "NV1"]]}, "names card 1"),
        ({"gpus": [], "topology": [[0, 0, "NV1"]]}, "cannot link to itself"),
        ({"gpus": [], "topology": [[0, 1, "NVLINK"]]}, "unknown link level 'NVLINK'"),
        ({"gpus": [], "topology": [[0, 1]]}, "topology[0]: expected [a, b, level]"),
        ({"gpus": [], "topology": [[0, 1, 2]]}, "the level must be a string"),
        ({"gpus": [], "topology": "NV1"}, "topology: expected a list"),
        ({"gpus": [], "driverVersion": ["5"]}, "driverVersion: expected a version string"),
    ],
)
def test_a_bad_document_is_one_line_naming_the_field(document: object, message: str) -> None:
    with pytest.raises(inventory.InventoryError) as raised:
        inventory.parse(document, source="inv.yaml")
    assert str(raised.value).startswith("inv.yaml")
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(inventory.InventoryError, match=r"nope.yaml: No such file"):
        inventory.load(tmp_path / "nope.yaml")


def test_invalid_yaml_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("gpus: [\n")
    with pytest.raises(inventory.InventoryError, match="invalid YAML") as raised:
        inventory.load(path)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("code", "expected"), [("NV12", "NV12"), ("nv1", "NV1"), ("sys", "SYS"), (" NODE ", "NODE"), ("PHB", "PHB"), ("PXB", "PXB")]
)
def test_link_codes_round_trip(code: str, expected: str) -> None:
    assert inventory.link(0, 1, code).code == expected


@pytest.mark.parametrize("code", ["NV0", "NV", "NVX", "X", "", "NV100"])
def test_unknown_link_codes_are_refused(code: str) -> None:
    with pytest.raises(ValueError, match="unknown link level"):
        inventory.link(0, 1, code)
