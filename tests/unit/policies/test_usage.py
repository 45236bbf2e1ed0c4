"""The usage summary: its codec round-trips, bad input never raises, and what counts as a change."""

from __future__ import annotations

import dataclasses
import json

import pytest

from policies.gpu import usage

POD = usage.PodUse(uid="u-1", namespace="ml", name="train-0", used_mib=4100, pids=2)
OOB = usage.OutOfBand(pid=41233, used_mib=5200, container_id="c" * 64)


def summary(**card: object) -> usage.NodeUsage:
    base = usage.CardUse(index=0, total_mib=16384, used_mib=9300, pods=(POD,), out_of_band=(OOB,))
    return usage.NodeUsage(cards=(dataclasses.replace(base, **card),), at="2026-11-26T12:00:00Z")  # type: ignore[arg-type]


def test_the_annotation_round_trips() -> None:
    original = summary(unknown=(7,))
    text = usage.render(original)
    assert usage.parse(text) == original
    document = json.loads(text)
    assert document["cards"][0]["outOfBand"] == [{"pid": 41233, "usedMiB": 5200, "containerID": "c" * 64}]
    assert document["cards"][0]["pods"] == [{"uid": "u-1", "namespace": "ml", "name": "train-0", "usedMiB": 4100, "pids": 2}]
    assert " " not in text  # compact


def test_a_process_without_a_memory_figure_keeps_none() -> None:
    text = usage.render(summary(out_of_band=(usage.OutOfBand(pid=5),)))
    parsed = usage.parse(text)
    assert parsed is not None and parsed.cards[0].out_of_band == (usage.OutOfBand(pid=5),)
    assert parsed.cards[0].out_of_band_mib == 0


def test_long_lists_are_cut_largest_first_and_say_how_many_were_left_out() -> None:
    many = tuple(usage.OutOfBand(pid=100 + i, used_mib=i) for i in range(usage.MAX_ENTRIES + 5))
    parsed = usage.parse(usage.render(summary(out_of_band=many)))
    assert parsed is not None
    card = parsed.cards[0]
    assert len(card.out_of_band) == usage.MAX_ENTRIES and card.truncated == 5
    assert card.out_of_band[0].used_mib == usage.MAX_ENTRIES + 4  # the largest are kept


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "{",
        "[]",
        '{"cards": 3}',
        '{"cards": [1]}',
        '{"cards": [{"index": -1, "totalMiB": 1}]}',
        '{"cards": [{"index": 0}]}',
        '{"cards": [{"index": 0, "totalMiB": 1}, {"index": 0, "totalMiB": 1}]}',
        '{"cards": [{"index": true, "totalMiB": 1}]}',
        42,
    ],
)
def test_malformed_annotations_read_as_none(text: object) -> None:
    assert usage.parse(text) is None


def test_malformed_entries_inside_a_card_are_skipped() -> None:
    text = json.dumps(
        {
            "cards": [
                {
                    "index": 0,
                    "totalMiB": 100,
                    "pods": [{"uid": 3}, POD_JSON],
                    "outOfBand": [{"pid": "x"}, {"pid": 9, "usedMiB": -1}],
                }
            ]
        }
    )
    parsed = usage.parse(text)
    assert parsed is not None
    assert parsed.cards[0].pods == (POD,)
    assert parsed.cards[0].out_of_band == (usage.OutOfBand(pid=9),)


POD_JSON = {"uid": "u-1", "namespace": "ml", "name": "train-0", "usedMiB": 4100, "pids": 2}


def test_pod_memory_is_summed_per_card() -> None:
    node = usage.NodeUsage(
        cards=(summary().cards[0], usage.CardUse(index=1, total_mib=100, pods=(dataclasses.replace(POD, used_mib=7),)))
    )
    assert node.pod_mib("u-1") == {0: 4100, 1: 7}
    assert node.pod_mib("nobody") == {}


def test_of_node_reads_the_annotation_from_a_node_object() -> None:
    node = {"metadata": {"annotations": {usage.USAGE_ANNOTATION: usage.render(summary())}}}
    assert usage.of_node(node) == summary()
    assert usage.of_node({"metadata": {"annotations": "x"}}) is None
    assert usage.of_node({}) is None


# --- significance ------------------------------------------------------------------------------


def test_the_first_summary_is_always_written() -> None:
    assert usage.significant(None, summary()) == "first summary"


def test_the_threshold_is_the_larger_of_256_mib_and_5_percent_of_the_card() -> None:
    assert usage.threshold_mib(4096) == 256
    assert usage.threshold_mib(81920) == 4096


@pytest.mark.parametrize(
    ("change", "significant"),
    [
        ({"used_mib": 9300 + 818}, False),  # below 5% of 16384 (819)
        ({"used_mib": 9300 + 819}, True),
        ({"used_mib": 9300 - 819}, True),
        ({"used_mib": None}, True),
        ({"total_mib": 32768}, True),
        ({"pods": ()}, True),  # a pod left the card
        ({"pods": (dataclasses.replace(POD, used_mib=4100 + 818),)}, False),
        ({"pods": (dataclasses.replace(POD, used_mib=4100 + 819),)}, True),
        ({"pods": (dataclasses.replace(POD, pids=3),)}, False),  # one more process, same memory
        ({"out_of_band": ()}, True),  # the out-of-band process went away
        ({"out_of_band": (OOB, usage.OutOfBand(pid=1, used_mib=0))}, True),  # a new one, however small
        ({"out_of_band": (dataclasses.replace(OOB, used_mib=5200 + 819),)}, True),
        ({"out_of_band": (dataclasses.replace(OOB, used_mib=5200 + 100),)}, False),
        ({"unknown": (1, 2, 3)}, False),  # unreadable processes alone are no reason to write
    ],
)
def test_what_counts_as_a_significant_change(change: dict[str, object], significant: bool) -> None:
    assert bool(usage.significant(summary(), summary(**change))) is significant


def test_a_card_appearing_is_significant() -> None:
    two = usage.NodeUsage(cards=(*summary().cards, usage.CardUse(index=1, total_mib=16384)))
    assert usage.significant(summary(), two) == "the cards changed"


def test_the_timestamp_alone_is_no_change() -> None:
    assert usage.significant(summary(), dataclasses.replace(summary(), at="2030-01-01T00:00:00Z")) == ""
