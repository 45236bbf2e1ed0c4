"""Each bench is tied to its record schema (headline key, unit, direction, reference), so a rename in a
bench cannot leave the table and the plots comparing different things under one name."""

from __future__ import annotations

import ast
import pathlib
import re
import sys
from typing import Any

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
sys.path.insert(0, str(BENCH))  # bench/ is not a package; its scripts import records the same way
import records  # noqa: E402

HELPERS = {"records.py", "plot.py", "apiserver_probe.py"}  # not benches: nothing to record
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if p.name not in HELPERS)


def _writes(script: str) -> list[ast.Call]:
    tree = ast.parse((BENCH / script).read_text())
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "write"
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "records"
    ]


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _benches(call: ast.Call) -> set[str]:
    """The bench names a write names: a literal, or each branch of a conditional expression."""
    node = _keyword(call, "bench")
    if isinstance(node, ast.IfExp):
        return {_literal(node.body), _literal(node.orelse)}
    return {_literal(node)}


def _literal(node: ast.expr | None) -> Any:
    """A literal's value; a dict display's literal keys (values left out); None otherwise."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Dict):
        return {k.value for k in node.keys if isinstance(k, ast.Constant)}
    return None


def test_the_scripts_are_found() -> None:
    assert len(SCRIPTS) >= 18, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_record_a_bench_writes_names_its_schemas_headline_unit_and_direction(script: str) -> None:
    writes = _writes(script)
    assert writes, f"bench/{script} writes no record"
    for call, bench in ((one, bench) for one in writes for bench in sorted(_benches(one), key=str)):
        assert bench in records.SCHEMAS, f"bench/{script}: bench={bench!r} has no schema in bench/records.py SCHEMAS"
        schema = records.SCHEMAS[bench]
        headline = _keyword(call, "headline")
        assert isinstance(headline, ast.Call), f"bench/{script}: headline=records.Headline(...)"
        assert _literal(_keyword(headline, "figure")) == schema.figure, (
            f"bench/{script}: the headline figure is not {schema.figure!r}"
        )
        assert _literal(_keyword(headline, "unit")) == schema.unit, f"bench/{script}: the headline unit is not {schema.unit!r}"
        assert _literal(_keyword(headline, "better")) == schema.better, f"bench/{script}: better is not {schema.better!r}"
        reference = _keyword(call, "reference")
        if not schema.reference:
            assert reference is None, f"bench/{script}: {bench}'s schema has no reference"
            continue
        assert reference is not None and not (isinstance(reference, ast.Constant) and reference.value is None), (
            f"bench/{script}: {bench} needs its reference"
        )
        # Where the reference's figures are written out here, they carry the headline's key.
        if isinstance(reference, ast.Dict):
            figures = dict(
                zip((_literal(k) if k is not None else None for k in reference.keys), reference.values, strict=True)
            ).get("figures")
            if isinstance(figures, ast.Dict):
                keys = {_literal(k) if k is not None else "**" for k in figures.keys}
                assert schema.figure in keys or "**" in keys, f"bench/{script}: the reference's figures have no {schema.figure!r}"


def test_every_schema_belongs_to_a_bench_that_writes_it() -> None:
    written = {bench for script in SCRIPTS for call in _writes(script) for bench in _benches(call)}
    assert set(records.SCHEMAS) == written


def test_run_all_runs_every_bench_in_both_scales() -> None:
    script = (BENCH / "run_all.sh").read_text()
    smoke, full = (
        script.split('if [ "$smoke" = 1 ]; then\n  # Tiny', 1)[1]
        .split('\nfi\nif [ "$real_node" = 1 ]', 1)[0]
        .split("\nelse\n", 1)
    )
    named = {tier: set(re.findall(r"^\s*run (\w+)\s", text, re.MULTILINE)) for tier, text in (("smoke", smoke), ("full", full))}
    # real_node_creates needs root and Docker: --with-real-node adds it, after both.
    # extender_throughput_5000: the same script at 5,000 nodes, in the full run only.
    assert named["smoke"] == set(records.SCHEMAS) - {"real_node_creates", "extender_throughput_5000"}
    assert named["full"] == set(records.SCHEMAS) - {"real_node_creates"}
    assert "run real_node_creates" in script


def _record(**changes: Any) -> dict[str, Any]:
    schema = records.SCHEMAS["extender_throughput"]
    record = records.make(
        bench="extender_throughput",
        inputs={},
        figures={schema.figure: 100.0},
        reference={"name": "plain", "figures": {schema.figure: 200.0}},
        headline=records.Headline(figure=schema.figure, label="pods/s", unit=schema.unit, better=schema.better),
    )
    record.update(changes)
    return record


def test_a_record_matching_its_schema_passes_and_each_mismatch_is_named() -> None:
    assert records.check(_record()) == []
    assert records.check(_record(headline={"figure": "pods_per_s", "label": "x", "unit": "pods/s", "better": "higher"})) == [
        "extender_throughput: headline figure is 'pods_per_s', the schema says 'extender_pods_per_s'",
    ]
    assert records.check(_record(reference=None)) == ["extender_throughput: no reference measured in the same run"]
    assert records.check(_record(reference={"name": "plain", "figures": {}})) == [
        "extender_throughput: reference figures['extender_pods_per_s'] is not a number (nor censored)",
    ]
    assert records.check(_record(figures={"extender_pods_per_s": "fast"})) == [
        "extender_throughput: figures['extender_pods_per_s'] is not a number",
    ]
    assert records.check(_record(bench="renamed")) == ["renamed: no schema in bench/records.py SCHEMAS"]
    # History transcribed from prose is not held to today's schema.
    assert records.check(_record(source="transcribed", reference=None)) == []


def test_a_reference_that_did_not_finish_is_censored_with_no_ratio() -> None:
    schema = records.SCHEMAS["preemption"]
    head = records.Headline(figure=schema.figure, label="p50", unit=schema.unit, better=schema.better)
    reference = records.censored("no preempt verb", figure=schema.figure, at_least=120.0, figures={"stuck_after_s": 120.0})
    record = records.make(bench="preemption", inputs={}, figures={schema.figure: 0.6}, reference=reference, headline=head)
    assert record["ratio"] is None
    assert record["reference"] == {
        "name": "no preempt verb",
        "figures": {"stuck_after_s": 120.0},
        "censored": {schema.figure: 120.0},
    }
    assert records.check(record) == []
    assert records.check({**record, "ratio": 0.005}) == [
        "preemption: the reference is censored (>= 120.0), so the ratio must be null"
    ]
    assert "≥ 120 (did not finish: no preempt verb)" in records.table([record])


def test_a_bench_of_the_schemas_cannot_write_a_record_that_does_not_match(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPU_ADMISSION_BENCH_RESULTS", str(tmp_path))
    with pytest.raises(ValueError, match="no reference measured in the same run"):
        records.write(
            bench="extender_throughput",
            inputs={},
            figures={"extender_pods_per_s": 1.0},
            headline=records.Headline(figure="extender_pods_per_s", label="x", unit="pods/s", better="higher"),
        )


def test_a_run_is_checked_bench_by_bench(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_ADMISSION_BENCH_RESULTS", str(tmp_path))
    schema = records.SCHEMAS["fuzz_long"]
    records.write(
        bench="fuzz_long",
        inputs={},
        figures={schema.figure: 0},
        headline=records.Headline(figure=schema.figure, label="x", unit=schema.unit, better=schema.better),
    )
    assert records.check_run(tmp_path, ["fuzz_long"]) == []
    assert records.check_run(tmp_path, ["fuzz_long", "soak"]) == [f"soak: no record in {tmp_path}"]
    assert records.check_run(tmp_path, ["fuzz_long"], commit_prefix="0000000") == [
        f"fuzz_long: the newest record is of {records.commit()}, not 0000000",
    ]


def test_the_committed_measured_records_match_their_schemas() -> None:
    found = [r for r in records.load(records.RESULTS) if r.get("source") == "measured"]
    problems = [problem for record in found for problem in records.check(record)]
    assert problems == []


def test_ci_runs_the_bench_smoke_tier_after_the_control_plane_is_built() -> None:
    script = (REPO / ".ci" / "run").read_text()
    [default] = re.findall(r"^TIERS=\((.*)\)$", script, flags=re.MULTILINE)
    tiers = default.split()
    assert tiers.index("controlplane") < tiers.index("bench")
    body = script[script.index("\nbench() {") :]
    body = body[: body.index("\n}\n")]
    assert "bash bench/run_all.sh --smoke" in body and "GPU_ADMISSION_BENCH_RESULTS=" in body
