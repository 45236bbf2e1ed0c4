"""Benchmark results as data: every bench writes one record, the plots and the table follow the records."""

from __future__ import annotations

import ast
import json
import pathlib
import sys
from typing import Any

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))  # bench/ is not a package; its scripts import records the same way
import plot  # noqa: E402
import records  # noqa: E402

HELPERS = {"records.py", "plot.py", "apiserver_probe.py"}  # not benches: nothing to record


def test_a_record_names_the_bench_commit_machine_inputs_figures_and_reference(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPU_ADMISSION_BENCH_RESULTS", str(tmp_path))
    path = records.write(
        bench="example",
        inputs={"pods": 10, "where": tmp_path},
        figures={"cpu_ms": 3.0},
        reference={"name": "before", "figures": {"cpu_ms": 4.0}},
        headline=records.Headline(figure="cpu_ms", label="CPU", unit="ms", better="lower"),
    )
    assert path.parent == tmp_path / "example"
    record = json.loads(path.read_text())
    assert record["bench"] == "example" and record["source"] == "measured"
    assert record["commit"] != "" and record["date"].endswith("Z")
    assert set(record["machine"]) == {"cpu", "cores", "python", "load_before", "load_after"}
    assert record["inputs"] == {"pods": 10, "where": str(tmp_path)}
    assert record["ratio"] == 0.75
    assert records.latest(records.load(tmp_path)) == [record]


def test_a_ratio_the_bench_computed_wins_and_none_without_a_reference() -> None:
    head = records.Headline(figure="x", label="x", unit="-", better="lower")
    assert records.make(bench="b", inputs={}, figures={"x": 1}, headline=head, ratio=0.5)["ratio"] == 0.5
    assert records.make(bench="b", inputs={}, figures={"x": 1}, headline=head)["ratio"] is None


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py") if p.name not in HELPERS))
def test_every_bench_script_writes_its_record_through_the_shared_helper(script: str) -> None:
    tree = ast.parse((BENCH / script).read_text())
    imported = any(isinstance(n, ast.Import) and any(a.name == "records" for a in n.names) for n in tree.body)
    writes = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "write"
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "records"
    ]
    assert imported and writes, f"bench/{script} must import records and call records.write(...) at the end of a run"


def test_the_committed_records_are_well_formed() -> None:
    found = records.load(records.RESULTS)
    assert found
    for record in found:
        assert record["headline"]["figure"] in record["figures"], record["bench"]
        assert record["headline"]["better"] in ("lower", "higher")
        assert {"cpu", "cores", "python"} <= set(record["machine"])


def test_the_plots_are_current_with_the_records() -> None:
    points = plot.series(records.load(records.RESULTS))
    committed = {p.stem: p for p in plot.OUT.glob("*.png")}
    assert set(committed) == set(points), "run `.venv/bin/python bench/plot.py` and commit docs/img/bench/"
    for bench, path in committed.items():
        assert plot.written_digest(path) == plot.digest(points[bench]), (
            f"{path.name} is stale: run `.venv/bin/python bench/plot.py`"
        )


def test_plot_draws_a_png_per_bench_with_a_ratio_and_marks_what_it_drew(tmp_path: pathlib.Path) -> None:
    head = {"figure": "x", "label": "x", "unit": "-", "better": "lower"}
    made: list[dict[str, Any]] = [
        {"bench": "a", "date": "2026-01-01T00:00:00Z", "commit": "c1", "ratio": 0.9, "headline": head},
        {"bench": "a", "date": "2026-01-02T00:00:00Z", "commit": "c2", "ratio": 0.8, "headline": head},
        {"bench": "b", "date": "2026-01-02T00:00:00Z", "commit": "c2", "ratio": None, "headline": head},
    ]
    (tmp_path / "old.png").write_bytes(b"")
    written = plot.plot(made, out=tmp_path)
    assert [p.name for p in written] == ["a.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.png"]
    assert (tmp_path / "a.png").read_bytes().startswith(b"\x89PNG")
    assert plot.written_digest(tmp_path / "a.png") == plot.digest(
        [("2026-01-01T00:00:00Z", "c1", 0.9), ("2026-01-02T00:00:00Z", "c2", 0.8)]
    )
