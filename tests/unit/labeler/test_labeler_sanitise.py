"""Card names become valid label values: GFD's rule, cut to 63 characters, alphanumeric at both ends."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook.labeler import labels

# apimachinery IsValidLabelValue: at most 63 characters of this shape.
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def valid(value: str) -> bool:
    return len(value) <= 63 and LABEL_VALUE.match(value) is not None


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("Tesla V100-SXM2-32GB", "Tesla-V100-SXM2-32GB"),
        ("Tesla T4", "Tesla-T4"),
        ("Tesla-M40", "Tesla-M40"),
        ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"),
        ("NVIDIA TITAN X (Pascal)", "NVIDIA-TITAN-X-Pascal"),
        ("NVIDIA GeForce RTX 4090 D", "NVIDIA-GeForce-RTX-4090-D"),
        ("  Tesla   T4  ", "Tesla-T4"),
        ("Tesla\tT4", "TeslaT4"),  # only spaces separate words: a tab is an odd character, dropped as in GFD
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("NVIDIA® Tesla® P4™", "NVIDIA-Tesla-P4"),
        ("Quadro RTX 6000/8000", "Quadro-RTX-60008000"),
        ("-_.Tesla T4._-", "Tesla-T4"),
        ("(Tesla T4)", "Tesla-T4"),
        ("Tesla T4 -", "Tesla-T4"),
        ("GPU #1: A10", "GPU-1-A10"),
    ],
)
def test_names_are_sanitised_like_gpu_feature_discovery(name: str, expected: str) -> None:
    assert labels.sanitise(name) == expected
    assert valid(expected)


@pytest.mark.parametrize("name", ["", "   ", "()", "-_.", "™®", "\n"])
def test_a_name_with_nothing_label_safe_becomes_unknown(name: str) -> None:
    assert labels.sanitise(name) == "unknown"


def test_a_63_character_name_is_kept_whole() -> None:
    name = "A" * 63
    assert labels.sanitise(name) == name


def test_a_long_name_is_cut_to_63_characters_with_alphanumeric_ends() -> None:
    value = labels.sanitise("NVIDIA " + "Very Long Model Name " * 5)
    assert len(value) <= 63
    assert valid(value)
    assert value.startswith("NVIDIA-Very-Long-Model-Name")


def test_a_cut_that_lands_on_a_separator_does_not_end_the_value_with_it() -> None:
    # 62 alphanumerics then '-', so a plain 63-character cut would end in '-'.
    value = labels.sanitise("B" * 62 + " tail")
    assert value == "B" * 62


def test_a_long_mig_name_keeps_its_profile_suffix() -> None:
    # The 67-character product of NVIDIA/k8s-device-plugin PR #1880.
    value = labels.sanitise("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition MIG 1g.24gb")
    assert len(value) <= 63
    assert valid(value)
    assert value.endswith("-MIG-1g.24gb")
    assert value.startswith("NVIDIA-RTX-PRO-6000-Blackwell")


def test_a_mig_suffix_too_long_to_keep_falls_back_to_a_plain_cut() -> None:
    value = labels.sanitise("A10 MIG " + "x" * 70)
    assert len(value) == 63
    assert valid(value)


@given(st.text(max_size=200))
def test_every_name_becomes_a_valid_non_empty_label_value(name: str) -> None:
    value = labels.sanitise(name)
    assert value
    assert valid(value)


@given(st.text(alphabet=st.sampled_from("AZaz09-_. ()#/"), max_size=120))
def test_sanitising_is_idempotent(name: str) -> None:
    once = labels.sanitise(name)
    assert labels.sanitise(once) == once
