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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Schema:
    """What a bench's record must hold: its headline figure's key, unit and direction, and whether a
    reference measured in the same run must stand beside it (under the same key in
    ``reference["figures"]``, or in ``reference["censored"]`` where it could not finish)."""

    figure: str
    unit: str
    better: Literal["lower", "higher"]
    reference: bool


# One schema per bench: a rename in a bench that is not made here fails its write (``check``) and
# the unit test that reads every bench script (tests/unit/bench/test_bench_schema.py), so the table
# never compares different things under one name.
SCHEMAS: dict[str, Schema] = {
    "audit_inprocess": Schema(figure="cpu_s", unit="s", better="lower", reference=True),
    "audit_throughput": Schema(figure="median_cpu_s", unit="s", better="lower", reference=True),
    "cel_candidates": Schema(figure="eval_us_median", unit="µs", better="lower", reference=True),
    "compare_opa": Schema(figure="cpu_s_per_1k", unit="s", better="lower", reference=True),
    "dryrun_throughput": Schema(figure="evaluate_objects_per_s", unit="objects/s", better="higher", reference=True),
    "e2e_pod_creates": Schema(figure="cpu_with_per_s", unit="creates/s", better="higher", reference=True),
    "explain_scale": Schema(figure="explain_cli_cpu_s", unit="CPU s", better="lower", reference=False),
    "extender_cpu": Schema(figure="after_ms_per_pod", unit="ms", better="lower", reference=True),
    "extender_throughput": Schema(figure="extender_pods_per_s", unit="pods/s", better="higher", reference=True),
    "extender_throughput_5000": Schema(figure="extender_pods_per_s", unit="pods/s", better="higher", reference=True),
    "fuzz_long": Schema(figure="failures", unit="count", better="lower", reference=False),
    "labeler_usage": Schema(figure="cpu_ms_per_pass_median", unit="ms", better="lower", reference=False),
    "labeler_usage_churn": Schema(figure="writes_per_min", unit="writes/min", better="lower", reference=True),
    "policies_inprocess": Schema(figure="engine_us", unit="µs", better="lower", reference=True),
    "preemption": Schema(figure="to_running_p50_s", unit="s", better="lower", reference=True),
    "real_node_creates": Schema(figure="creates_per_s", unit="creates/s", better="higher", reference=True),
    "replica_stream": Schema(figure="engine_us_per_review", unit="µs", better="lower", reference=True),
    "soak": Schema(figure="rss_growth_after_warmup_mib", unit="MiB", better="lower", reference=False),
    "usage_writes_kwok": Schema(figure="writes_per_min", unit="writes/min", better="lower", reference=True),
    "webhook_load": Schema(figure="cpu_s_per_1k", unit="s", better="lower", reference=True),
}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check(record: Mapping[str, Any]) -> list[str]:
    """What is wrong with a measured record against its bench's schema (empty when nothing is).

    Records transcribed from prose (``source`` other than "measured") are history and not checked.
    """
    if record.get("source") != "measured":
        return []
    bench = record.get("bench")
    schema = SCHEMAS.get(str(bench))
    if schema is None:
        return [f"{bench}: no schema in bench/records.py SCHEMAS"]
    problems: list[str] = []
    head = record.get("headline") or {}
    for key in ("figure", "unit", "better"):
        if head.get(key) != getattr(schema, key):
            problems.append(f"{bench}: headline {key} is {head.get(key)!r}, the schema says {getattr(schema, key)!r}")
    if not _is_number((record.get("figures") or {}).get(schema.figure)):
        problems.append(f"{bench}: figures[{schema.figure!r}] is not a number")
    for key in ("commit", "date"):
        if not record.get(key):
            problems.append(f"{bench}: no {key}")
    found = record.get("machine") or {}
    for key in ("cpu", "cores", "load_before", "load_after"):
        if found.get(key) is None:
            problems.append(f"{bench}: machine has no {key}")
    reference = record.get("reference")
    if schema.reference:
        if not isinstance(reference, Mapping) or not reference.get("name"):
            problems.append(f"{bench}: no reference measured in the same run")
        else:
            theirs = (reference.get("figures") or {}).get(schema.figure)
            censored = (reference.get("censored") or {}).get(schema.figure)
            if _is_number(censored):
                if record.get("ratio") is not None:
                    problems.append(f"{bench}: the reference is censored (>= {censored}), so the ratio must be null")
            elif not _is_number(theirs):
                problems.append(f"{bench}: reference figures[{schema.figure!r}] is not a number (nor censored)")
            elif not _is_number(record.get("ratio")) and theirs != 0:
                problems.append(f"{bench}: no ratio")
    elif reference is not None:
        problems.append(f"{bench}: the schema has no reference, the record has one")
    return problems


def censored(name: str, *, figure: str, at_least: float, figures: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A reference whose headline figure could not be measured because it did not finish: it is at
    least ``at_least`` (a timeout), recorded as censored instead of as a time; the ratio is null."""
    return {"name": name, "figures": {k: v for k, v in (figures or {}).items() if k != figure}, "censored": {figure: at_least}}


def results_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("GPU_ADMISSION_BENCH_RESULTS", RESULTS))


def commit(repo: pathlib.Path = REPO) -> str:
    """The short commit of the tree the bench ran, with ``-dirty`` when tracked files had changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()
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
    # Written first (a long run's figures are kept), then refused: a bench of SCHEMAS whose record
    # does not match its schema fails its run.
    problems = check(record) if bench in SCHEMAS else []
    if problems:
        raise ValueError(f"{path}: the record does not match its schema: " + "; ".join(problems))
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


def _reference_name(name: Any) -> str:
    """A reference's name as the table shows it: a source directory by its last part (the
    machine's path says nothing to a reader; run_all.sh names it after the commit)."""
    words = str(name or "")
    return pathlib.PurePosixPath(words).name if words.startswith("/") else words


def _reference_words(record: Mapping[str, Any]) -> str:
    head = record["headline"]
    reference = {**(record.get("reference") or {})}
    reference["name"] = _reference_name(reference.get("name"))
    theirs = reference.get("figures", {}).get(head["figure"])
    at_least = (reference.get("censored") or {}).get(head["figure"])
    if at_least is not None:
        return f"≥ {_number(at_least)} (did not finish: {reference.get('name', '')})"
    return f"{_number(theirs)} ({reference.get('name', '')})" if theirs is not None else "—"


def commits(latest_records: Sequence[Mapping[str, Any]]) -> list[str]:
    """The commits the measured records among ``latest_records`` ran, most records first."""
    counted: dict[str, int] = {}
    for record in latest_records:
        if record.get("source") == "measured":
            counted[record["commit"]] = counted.get(record["commit"], 0) + 1
    return sorted(counted, key=lambda c: (-counted[c], c))


def table(latest_records: Sequence[Mapping[str, Any]]) -> str:
    """The latest records as a Markdown table narrow enough for a laptop (bench, headline, ours,
    reference, ratio), then a line saying which commit the figures were measured at and a details
    line per bench: which way is better, commit, machine and its load, date, and whether the figure
    was measured by a run or transcribed from older prose."""
    measured_at = commits(latest_records)
    measured = sum(1 for r in latest_records if r.get("source") == "measured")
    if measured_at:
        lead = (
            f"Measured at commit `{measured_at[0]}`"
            + (f" (and {', '.join(f'`{c}`' for c in measured_at[1:])})" if len(measured_at) > 1 else "")
            + f": {measured} of {len(latest_records)} benches; the others' latest figures are transcribed from older prose."
        )
    else:
        lead = "No bench has a measured record yet: every figure below is transcribed from older prose."
    lines = [
        lead,
        "",
        "| bench | headline | ours | reference | ratio |",
        "|---|---|---:|---|---:|",
    ]
    details = []
    for record in latest_records:
        head = record["headline"]
        ratio = record.get("ratio")
        arrow = "↓" if head["better"] == "lower" else "↑"
        transcribed = record.get("source") != "measured"
        lines.append(
            f"| `{record['bench']}`{' *' if transcribed else ''} | {head['label']} ({head['unit']}, {arrow}) "
            f"| {_number(record['figures'].get(head['figure']))} | {_reference_words(record)} "
            f"| {_number(ratio) if ratio is not None else '—'} |"
        )
        details.append(
            f"- `{record['bench']}`: {head['better']} is better; `{record['commit']}`, {_machine_words(record['machine'])}, "
            f"{record['date'][:10]}{', transcribed from prose' if transcribed else ''}"
        )
    lines += [
        "",
        "↓ lower is better, ↑ higher; \\* transcribed from older prose, not measured by a run. "
        "Ratio: ours over the reference's; where the reference did not finish (≥, censored) there is none.",
        "",
        *details,
    ]
    return "\n".join(lines)


# --- checking a run ----------------------------------------------------------------------------------


def check_run(results: pathlib.Path, benches: Sequence[str], *, commit_prefix: str = "") -> list[str]:
    """What is wrong with a run's records in ``results``: for each bench, its newest record must
    exist, be of ``commit_prefix`` (where given) and match its schema."""
    newest = {r["bench"]: r for r in latest(load(results))} if results.is_dir() else {}
    problems: list[str] = []
    for bench in benches:
        record = newest.get(bench)
        if record is None:
            problems.append(f"{bench}: no record in {results}")
            continue
        if record.get("source") != "measured":
            problems.append(f"{bench}: the newest record was not measured by a run ({record.get('source')})")
            continue
        if commit_prefix and not str(record.get("commit", "")).startswith(commit_prefix):
            problems.append(f"{bench}: the newest record is of {record.get('commit')}, not {commit_prefix}")
        problems += check(record)
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="bench/records.py", description="Check a run's records against the benches' schemas.")
    commands = parser.add_subparsers(dest="command", required=True)
    checking = commands.add_parser("check", help="every named bench wrote a well-formed record (exit 1 if not)")
    checking.add_argument("benches", nargs="+")
    checking.add_argument("--results", type=pathlib.Path, default=RESULTS)
    checking.add_argument("--commit", default="", help="the commit the records must be of")
    args = parser.parse_args(argv)
    problems = check_run(args.results, args.benches, commit_prefix=args.commit)
    for problem in problems:
        print(f"record: {problem}")
    print(
        f"records: {len(args.benches) - len({p.split(':')[0] for p in problems})} of {len(args.benches)} benches wrote a well-formed record"
    )
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
