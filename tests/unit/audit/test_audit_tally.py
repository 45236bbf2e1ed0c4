"""The one-pass tallies of a run's results (`report.tallied`, `render.selected`) against the per-finding definitions (issue 19)."""

from __future__ import annotations

import itertools
import random

from policies import model
from webhook.audit import findings, render, report, scan


def _finding(result: model.Result, action: model.Action, index: int) -> findings.Finding:
    return findings.Finding(
        policy=f"GPU{index % 7:03d}",
        rule="r",
        result=result,
        action=action,
        severity=findings.Severity.HIGH,
        category="c",
        message=f"m{index}",
        subject=findings.ObjectRef(namespace=f"ns{index % 3}", kind="Pod", name=f"p{index}"),
    )


def _generated() -> list[findings.Finding]:
    """Every (result, action) pair, each a random number of times (some not at all)."""
    rng = random.Random(19)
    made: list[findings.Finding] = []
    for result, action in itertools.product(model.Result, model.Action):
        made.extend(_finding(result, action, len(made) + i) for i in range(rng.choice((0, 1, 3, 17))))
    rng.shuffle(made)
    return made


def test_tallied_counts_what_result_of_and_enforced_say_one_by_one() -> None:
    made = _generated()
    naive: dict[str, int] = {"pass": 0, "fail": 0, "warn": 0, "error": 0, "skip": 0}
    for found in made:
        naive[report.result_of(found)] += 1
    tally, enforced = report.tallied(made)
    assert dict(tally) == naive
    assert report.counts(made) == tally
    assert enforced == sum(1 for found in made if found.enforced)
    assert enforced > 0 and tally["warn"] > 0  # a warn-level failure counts as warn, an enforced one is counted


def test_tallied_of_nothing_is_all_zero() -> None:
    assert report.tallied([]) == ({"pass": 0, "fail": 0, "warn": 0, "error": 0, "skip": 0}, 0)


def test_selected_is_what_a_report_stores() -> None:
    made = _generated()
    audit = scan.Audit(findings=tuple(made), scope=scan.Scope(), objects=len(made), folded=0, namespaces=frozenset())
    for all_results in (False, True):
        assert render.selected(audit, all_results=all_results) == [f for f in made if report.stored(f, all_results=all_results)]
    assert len(render.selected(audit, all_results=False)) < len(made)  # passes were left out


def test_summary_line_counts_enforced_failures() -> None:
    made = [
        _finding(model.Result.FAIL, model.Action.ENFORCE, 1),
        _finding(model.Result.ERROR, model.Action.ENFORCE, 2),
        _finding(model.Result.FAIL, model.Action.WARN, 3),
        _finding(model.Result.PASS, model.Action.ENFORCE, 4),
    ]
    audit = scan.Audit(findings=tuple(made), scope=scan.Scope(), objects=4, folded=0, namespaces=frozenset())
    line = render.summary_line(audit)
    assert line == "4 object(s) audited: 1 fail, 1 warn, 1 error, 0 skip, 1 pass; 2 at enforce level"
