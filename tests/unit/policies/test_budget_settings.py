"""`gpuBudgets`: a valid document is read, every malformed budget is refused naming its field, and
the first entry that selects a namespace gives its budget (none: unlimited)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from policies import settings
from policies.settings import budgets, selection

DOCUMENT = """
gpuBudgets:
  - name: team-a
    namespaces: [team-a, team-a-batch]
    memory: 160Gi
    cards: 4
  - name: labs
    namespaceSelector:
      matchLabels: {gpu-admission.io/tier: lab}
      matchExpressions: [{key: env, operator: NotIn, values: [prod]}]
    memory: 40960Mi
  - name: everyone-labelled
    namespaceSelector:
      matchExpressions: [{key: gpu-admission.io/team, operator: Exists}]
    memory: 32Gi
    cards: 0
"""


def read(*entries: dict[str, Any]) -> tuple[budgets.Budget, ...]:
    return settings.from_mapping({"gpuBudgets": list(entries)}).gpu_budgets


def refusal(*entries: Any) -> str:
    with pytest.raises(settings.InvalidSettings) as raised:
        settings.from_mapping({"gpuBudgets": list(entries)})
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_a_valid_document_gives_each_entry_its_names_selector_memory_and_cards() -> None:
    parsed = settings.from_mapping(yaml.safe_load(DOCUMENT)).gpu_budgets

    assert [b.name for b in parsed] == ["team-a", "labs", "everyone-labelled"]
    team_a, labs, labelled = parsed
    assert team_a.match.names == {"team-a", "team-a-batch"} and team_a.match.selector is None
    assert (team_a.memory_mib, team_a.cards, team_a.memory_text) == (160 * 1024, 4, "160Gi")
    assert labs.match.names == frozenset()
    assert labs.match.selector == selection.LabelSelector(
        match_labels={"gpu-admission.io/tier": "lab"},
        match_expressions=(selection.Requirement(key="env", operator="NotIn", values=frozenset({"prod"})),),
    )
    assert (labs.memory_mib, labs.cards) == (40960, None)  # cards left out: not limited
    assert (labelled.memory_mib, labelled.cards) == (32 * 1024, 0)  # zero cards: shares and slices only


def test_the_budget_describes_itself_as_written() -> None:
    team_a, labs, labelled = settings.from_mapping(yaml.safe_load(DOCUMENT)).gpu_budgets

    assert team_a.describe() == "budget 'team-a' (160Gi of GPU memory and 4 whole cards)"
    assert labs.describe() == "budget 'labs' (40960Mi of GPU memory)"
    assert labelled.describe() == "budget 'everyone-labelled' (32Gi of GPU memory and 0 whole cards)"
    one = budgets.Budget(name="x", match=team_a.match, memory_mib=1024, cards=1)
    assert one.describe() == "budget 'x' (1024Mi of GPU memory and 1 whole card)"


@pytest.mark.parametrize(
    ("written", "mib"),
    [
        ("160Gi", 163840),
        ("40960Mi", 40960),
        ("1Ti", 1048576),
        ("1.5Gi", 1536),
        ("0Gi", 0),  # a namespace that may hold no GPU memory at all
        ("100G", 95367),  # decimal gigabytes, rounded down to whole MiB
        ("100e9", 95367),  # an exponent says the unit (bytes) as plainly as a suffix
    ],
)
def test_memory_is_any_quantity_with_a_unit_in_whole_mib(written: str, mib: int) -> None:
    (parsed,) = read({"name": "a", "namespaces": ["a"], "memory": written})
    assert parsed.memory_mib == mib
    assert parsed.memory_text == written


def test_an_empty_or_absent_section_means_no_budgets() -> None:
    assert settings.from_mapping({}).gpu_budgets == ()
    assert settings.from_mapping({"gpuBudgets": None}).gpu_budgets == ()
    assert settings.from_mapping({"gpuBudgets": []}).gpu_budgets == ()


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"name": "a", "namespaces": ["a"], "memory": "-1Gi"},
            "gpuBudgets[0].memory: must not be negative, got '-1Gi'",
        ),
        (
            {"name": "a", "namespaces": ["a"], "memory": "lots"},
            "gpuBudgets[0].memory: 'lots' is not a quantity; write e.g. 160Gi or 40960Mi",
        ),
        (
            {"name": "a", "namespaces": ["a"], "memory": "160 Gi"},
            "gpuBudgets[0].memory: '160 Gi' is not a quantity; write e.g. 160Gi or 40960Mi",
        ),
        (
            {"name": "a", "namespaces": ["a"], "memory": 160},  # YAML `memory: 160`
            "gpuBudgets[0].memory: 160 has no unit and would be bytes; write the unit, e.g. 160Gi or 160Mi",
        ),
        (
            {"name": "a", "namespaces": ["a"], "memory": "160"},
            "gpuBudgets[0].memory: '160' has no unit and would be bytes; write the unit, e.g. 160Gi or 160Mi",
        ),
        (
            {"name": "a", "namespaces": ["a"], "memory": "1.5"},
            "gpuBudgets[0].memory: '1.5' has no unit and would be bytes; write the unit, e.g. 1.5Gi or 1.5Mi",
        ),
        (
            {"name": "a", "namespaces": ["a"], "memory": "+160"},
            "gpuBudgets[0].memory: '+160' has no unit and would be bytes; write the unit, e.g. +160Gi or +160Mi",
        ),
        (
            {"name": "a", "namespaces": ["a"], "memory": 1.5},  # YAML `memory: 1.5`
            "gpuBudgets[0].memory: must be a quantity of bytes such as 160Gi or 40960Mi, got 1.5",
        ),
        (
            {"name": "a", "namespaces": ["a"], "memory": True},  # YAML `memory: yes`
            "gpuBudgets[0].memory: must be a quantity of bytes such as 160Gi or 40960Mi, got True",
        ),
        (
            {"name": "a", "namespaces": ["a"], "memory": None},
            "gpuBudgets[0].memory: must be a quantity of bytes such as 160Gi or 40960Mi, got None",
        ),
        (
            {"name": "a", "namespaces": ["a"]},
            "gpuBudgets[0].memory: required (GPU memory as a quantity, e.g. 160Gi)",
        ),
        (
            {"name": "a", "namespaces": ["a"], "memory": "8Gi", "cards": -1},
            "gpuBudgets[0].cards: must be a whole number of cards >= 0, got -1",
        ),
        (
            {"name": "a", "namespaces": ["a"], "memory": "8Gi", "cards": "2"},
            "gpuBudgets[0].cards: must be a whole number of cards >= 0, got '2'",
        ),
        (
            {"name": "a", "namespaces": ["a"], "memory": "8Gi", "cards": 1.5},
            "gpuBudgets[0].cards: must be a whole number of cards >= 0, got 1.5",
        ),
        (
            {"name": "a", "namespaces": ["a"], "memory": "8Gi", "cards": True},
            "gpuBudgets[0].cards: must be a whole number of cards >= 0, got True",
        ),
        (
            {"name": "a", "namespaces": ["a"], "memory": "8Gi", "gpus": 2},
            "gpuBudgets[0].gpus: unknown key; known: name, namespaces, namespaceSelector, memory, cards",
        ),
        (
            {"name": "", "namespaces": ["a"], "memory": "8Gi"},
            "gpuBudgets[0].name: must be a non-empty string, got ''",
        ),
        (
            {"name": "a", "namespaces": ["Team_A"], "memory": "8Gi"},
            "gpuBudgets[0].namespaces[0]: 'Team_A' is not a namespace name",
        ),
    ],
)
def test_a_malformed_budget_is_refused_with_one_line_naming_the_field(entry: dict[str, Any], message: str) -> None:
    assert refusal(entry) == message


UNANCHORED = (
    "is not anchored to namespaces: give namespaces, or a namespaceSelector with matchLabels, In or Exists "
    "(names and objectSelector are set by the pod's author, so they may only narrow an exception within its namespaces)"
)


@pytest.mark.parametrize(
    "where",
    [
        {},  # no namespaces at all: every namespace
        {"namespaceSelector": {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["prod"]}]}},
        {"namespaceSelector": {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}},
        {"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "Exists"}]}},
        {"namespaceSelector": {}},
    ],
)
def test_a_budget_not_anchored_to_namespaces_tenants_cannot_label_is_refused(where: dict[str, Any]) -> None:
    assert refusal({"name": "loose", "memory": "8Gi", **where}) == f"gpuBudgets[0]: entry 'loose' {UNANCHORED}"


def test_a_later_malformed_entry_is_named_by_its_index() -> None:
    good = {"name": "a", "namespaces": ["a"], "memory": "8Gi"}
    assert refusal(good, {"name": "b", "namespaces": ["b"], "memory": "-8Gi"}) == (
        "gpuBudgets[1].memory: must not be negative, got '-8Gi'"
    )


def test_budget_names_must_be_unique() -> None:
    assert refusal(
        {"name": "team", "namespaces": ["a"], "memory": "8Gi"}, {"name": "team", "namespaces": ["b"], "memory": "8Gi"}
    ) == ("gpuBudgets[1].name: 'team' is given twice; budget names must be unique")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"name": "a"}, "gpuBudgets: must be a list, got {'name': 'a'}"),
        ("team-a: 8Gi", "gpuBudgets: must be a list, got 'team-a: 8Gi'"),
        (["team-a"], "gpuBudgets[0]: must be a mapping, got 'team-a'"),
    ],
)
def test_a_section_of_the_wrong_shape_is_refused(value: object, message: str) -> None:
    with pytest.raises(settings.InvalidSettings) as raised:
        settings.from_mapping({"gpuBudgets": value})
    assert str(raised.value) == message


# --- which budget a namespace has ----------------------------------------------------------------


def test_the_first_matching_entry_decides() -> None:
    parsed = read(
        {"name": "first", "namespaces": ["team-a"], "memory": "8Gi"},
        {"name": "second", "namespaceSelector": {"matchLabels": {"team": "a"}}, "memory": "80Gi"},
    )

    assert budgets.budget_for(parsed, "team-a", {"team": "a"}) is parsed[0]
    assert budgets.budget_for(parsed, "team-a-dev", {"team": "a"}) is parsed[1]


def test_a_namespace_no_entry_selects_is_unlimited() -> None:
    parsed = read({"name": "a", "namespaces": ["team-a"], "memory": "8Gi"})

    assert budgets.budget_for(parsed, "team-b", {"team": "b"}) is None
    assert budgets.budget_for((), "team-a", None) is None
    assert settings.Settings().gpu_budget("team-a") is None


def test_a_selector_matches_the_namespace_labels() -> None:
    parsed = read(
        {
            "name": "labs",
            "namespaceSelector": {
                "matchLabels": {"tier": "lab"},
                "matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["prod"]}],
            },
            "memory": "40Gi",
        }
    )

    assert budgets.budget_for(parsed, "lab-1", {"tier": "lab"}) is parsed[0]
    assert budgets.budget_for(parsed, "lab-1", {"tier": "lab", "env": "dev"}) is parsed[0]
    assert budgets.budget_for(parsed, "lab-1", {"tier": "lab", "env": "prod"}) is None
    assert budgets.budget_for(parsed, "lab-1", {"tier": "prod"}) is None
    # Without its labels, a namespace has only the name label the apiserver sets: no selector on
    # another label can select it.
    assert budgets.budget_for(parsed, "lab-1", None) is None


def test_the_apiserver_name_label_selects_a_namespace_whose_labels_are_unknown() -> None:
    parsed = read(
        {
            "name": "by-name-label",
            "namespaceSelector": {
                "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["ml"]}]
            },
            "memory": "16Gi",
        }
    )

    assert budgets.budget_for(parsed, "ml", None) is parsed[0]
    assert budgets.budget_for(parsed, "ml", {"team": "x"}) is parsed[0]
    assert budgets.budget_for(parsed, "other", None) is None


def test_names_and_a_selector_together_must_both_hold() -> None:
    parsed = read(
        {"name": "both", "namespaces": ["team-a"], "namespaceSelector": {"matchLabels": {"gpu": "yes"}}, "memory": "8Gi"}
    )

    assert budgets.budget_for(parsed, "team-a", {"gpu": "yes"}) is parsed[0]
    assert budgets.budget_for(parsed, "team-a", {}) is None
    assert budgets.budget_for(parsed, "team-b", {"gpu": "yes"}) is None


def test_settings_answer_through_budget_for() -> None:
    loaded = settings.from_mapping(yaml.safe_load(DOCUMENT))

    assert loaded.gpu_budget("team-a-batch") == loaded.gpu_budgets[0]
    assert loaded.gpu_budget("x", {"gpu-admission.io/tier": "lab"}) == loaded.gpu_budgets[1]
    assert loaded.gpu_budget("x", {"gpu-admission.io/tier": "lab", "env": "prod"}) is None
    labelled = {"gpu-admission.io/tier": "lab", "env": "prod", "gpu-admission.io/team": "t"}
    assert loaded.gpu_budget("x", labelled) == loaded.gpu_budgets[2]
    assert loaded.gpu_budget("x") is None


def test_budgets_of_reads_only_the_budgets_of_a_whole_settings_document() -> None:
    # TEAM001 is a user policy: the extender, which loads none, must still read the budgets.
    document = {**yaml.safe_load(DOCUMENT), "policies": {"TEAM001": {"action": "warn"}}}

    assert [b.name for b in budgets.budgets_of(document)] == ["team-a", "labs", "everyone-labelled"]
    assert budgets.budgets_of(None) == ()
    with pytest.raises(settings.InvalidSettings) as raised:
        budgets.budgets_of(["gpuBudgets"])  # type: ignore[arg-type]  # a YAML list where a mapping belongs
    assert str(raised.value) == "settings: must be a mapping, got list"
    with pytest.raises(settings.InvalidSettings) as raised:
        budgets.budgets_of({"gpuBudgets": [{"name": "a", "namespaces": ["a"], "memory": "8"}]})
    assert str(raised.value) == "gpuBudgets[0].memory: '8' has no unit and would be bytes; write the unit, e.g. 8Gi or 8Mi"
