"""Benchmark results as data: one JSON record per bench run, under ``bench/results/<bench>/``.

Every bench script calls ``write`` once, with its figures, at the end of a run:

    records.write(
        bench="webhook_load",
        inputs=vars(args),
        figures={"cpu_us_per_review": 410.0, ...},
        reference={"name": "8900dc2", "figures": {"cpu_us_per_review": 760.0, ...}},
        headline=records.Headline(figure="cpu_us_per_review", label="CPU per review", unit="us", better="lower"),
    )

A record holds the bench's name, the commit of the tree it ran (``-dirty`` when the tree had
changes), the machine (CPU model, cores this process may use, Python, the load average when the
script started and when it wrote), the inputs, the figures, the reference's figures from the same
run (OPA, the tree before a change, the run without the webhook: whatever the bench compares
against) and which figure is the headline. ``ratio`` is ours over the reference's for the headline
figure. Records transcribed from the old prose of ``bench/README.md`` say so in ``source``.

Runs from the repository root (``bench/`` is then on ``sys.path``, as the scripts import it);
``$GPU_ADMISSION_BENCH_RESULTS`` writes elsewhere (the tests do). ``load``, ``latest`` and ``table``
feed ``bench/README.md``'s table and the documentation (``python -m docs.generate``), and
``bench/plot.py`` the history plots.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import platform
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
SCHEMA = 1
# The load average when the bench's process started (this module is imported at its top): the
# "before" of every record this process writes.
LOAD_AT_START: float = os.getloadavg()[0]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Headline:
    """The figure a bench is judged by: its key in ``figures``, words and unit, and which way is better."""

    figure: str
    label: str
    unit: str
    better: Literal["lower", "higher"]


def results_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("GPU_ADMISSION_BENCH_RESULTS", RESULTS))


def commit(repo: pathlib.Path = REPO) -> str:
    """The short commit of the tree the bench ran, with ``-dirty`` when tracked files had changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}-dirty" if dirty else head


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, "unknown" where it cannot be read."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def machine(*, load_before: float = LOAD_AT_START) -> dict[str, Any]:
    """What the figures were measured on, and how busy it was at the start and now."""
    return {
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def make(
    *,
    bench: str,
    inputs: Mapping[str, Any],
    figures: Mapping[str, Any],
    headline: Headline,
    reference: Mapping[str, Any] | None = None,
    ratio: float | None = None,
    notes: str = "",
) -> dict[str, Any]:
    """A record (not yet written); ``reference`` is ``{"name": ..., "figures": {...}}`` or None.

    ``ratio`` is for a bench that computes its headline ratio itself (medians of per-round ratios,
    say); otherwise it is the headline figure's, ours over the reference's.
    """
    now = datetime.datetime.now(datetime.UTC)
    record: dict[str, Any] = {
        "schema": SCHEMA,
        "bench": bench,
        "commit": commit(),
        "date": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "source": "measured",
        "machine": machine(),
        "inputs": _jsonable(dict(inputs)),
        "figures": _jsonable(dict(figures)),
        "reference": _jsonable(dict(reference)) if reference is not None else None,
        "headline": dataclasses.asdict(headline),
        "ratio": round(ratio, 3) if ratio is not None else ratio_of(figures, reference, headline.figure),
    }
    if notes:
        record["notes"] = notes
    return record


def ratio_of(figures: Mapping[str, Any], reference: Mapping[str, Any] | None, figure: str) -> float | None:
    """Ours over the reference's for ``figure``, None where either is missing or the reference is 0."""
    ours = figures.get(figure)
    theirs = (reference or {}).get("figures", {}).get(figure)
    if not isinstance(ours, (int, float)) or not isinstance(theirs, (int, float)) or theirs == 0:
        return None
    return round(float(ours) / float(theirs), 3)


def write(
    *,
    bench: str,
    inputs: Mapping[str, Any],
    figures: Mapping[str, Any],
    headline: Headline,
    reference: Mapping[str, Any] | None = None,
    ratio: float | None = None,
    notes: str = "",
) -> pathlib.Path:
    """Write one run's record as ``<results>/<bench>/<date>-<commit>.json``; returns its path."""
    record = make(bench=bench, inputs=inputs, figures=figures, headline=headline, reference=reference, ratio=ratio, notes=notes)
    directory = results_dir() / bench
    directory.mkdir(parents=True, exist_ok=True)
    stamp = record["date"].replace(":", "").replace("-", "")
    path = directory / f"{stamp}-{record['commit']}.json"
    path.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n")
    print(f"# record: {path}", flush=True)
    return path


# --- reading -----------------------------------------------------------------------------------------


def load(directory: pathlib.Path = RESULTS) -> list[dict[str, Any]]:
    """Every record under ``directory``, oldest first (by date, then file name)."""
    found: list[tuple[str, str, dict[str, Any]]] = []
    for path in sorted(directory.glob("*/*.json")):
        record: dict[str, Any] = json.loads(path.read_text())
        found.append((record["date"], path.name, record))
    return [record for _, _, record in sorted(found, key=lambda item: (item[0], item[1]))]


def latest(all_records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The newest record of each bench, by bench name."""
    newest: dict[str, Mapping[str, Any]] = {}
    for record in all_records:
        if record["bench"] not in newest or record["date"] >= newest[record["bench"]]["date"]:
            newest[record["bench"]] = record
    return [newest[name] for name in sorted(newest)]


def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "" if value is None else str(value)
    return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def _machine_words(found: Mapping[str, Any]) -> str:
    cpu = str(found.get("cpu", "?")).replace("(R)", "").replace("Processor", "").strip()
    return f"{cpu} ×{found.get('cores', '?')}, load {found.get('load_before', '?')} → {found.get('load_after', '?')}"


def table(latest_records: Sequence[Mapping[str, Any]]) -> str:
    """One Markdown table of the latest records: bench, headline figure, ours, reference, ratio, where and when."""
    lines = [
        "| bench | headline | ours | reference | ratio | better | commit | machine | date |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for record in latest_records:
        head = record["headline"]
        reference = record.get("reference") or {}
        theirs = reference.get("figures", {}).get(head["figure"])
        ref_words = f"{_number(theirs)} ({reference.get('name', '')})" if theirs is not None else "—"
        ratio = record.get("ratio")
        transcribed = " (from prose)" if record.get("source") != "measured" else ""
        lines.append(
            f"| `{record['bench']}` | {head['label']} ({head['unit']}) | {_number(record['figures'].get(head['figure']))} "
            f"| {ref_words} | {_number(ratio) if ratio is not None else '—'} | {head['better']} "
            f"| `{record['commit']}` | {_machine_words(record['machine'])} | {record['date'][:10]}{transcribed} |"
        )
    return "\n".join(lines)
