"""The examples on each policy's documentation page (tests/data/policies/examples/<ID>.yaml) get the
verdict their file says, and every policy has an example of each outcome it can have."""

from __future__ import annotations

import pytest

from docs import generate
from policies import model, policy
from policies.builtin import POLICIES

EXAMPLES = [example for item in POLICIES for example in generate.examples(item.id)]


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"{e.policy}: {e.title}" for e in EXAMPLES])
def test_each_example_gets_the_verdict_its_file_says(example: generate.Example) -> None:
    outcome = generate.judge(example)
    assert outcome.verdict == example.expect, (outcome.messages, outcome.patch)
    if outcome.verdict == "denied":
        assert outcome.messages and all(m.startswith(f"{example.policy}: ") for m in outcome.messages)
    if outcome.verdict == "mutated":
        assert outcome.patch


@pytest.mark.parametrize("item", POLICIES, ids=[p.id for p in POLICIES])
def test_every_policy_shows_an_example_it_lets_through_and_one_it_acts_on(item: policy.Policy) -> None:
    policy_id, kind = item.id, item.kind
    expected = {e.expect for e in generate.examples(policy_id)}
    if kind is model.PolicyKind.VALIDATE:
        assert {"allowed", "denied"} <= expected, (
            f"tests/data/policies/examples/{policy_id}.yaml needs an allowed and a denied example"
        )
    else:
        assert {"mutated", "unchanged"} <= expected, (
            f"tests/data/policies/examples/{policy_id}.yaml needs a mutated and an unchanged example"
        )


def test_a_wrong_expectation_is_caught() -> None:
    (first, *_) = generate.examples("GPU001")
    assert generate.judge(first).verdict == "denied"
    flipped = generate.Example(policy="GPU001", title="flipped", expect="allowed", object=first.object)
    assert generate.judge(flipped).verdict != flipped.expect
