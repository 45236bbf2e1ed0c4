"""Dry-run throughput: objects per second through ``gpu-admission dry-run``, in stages and end to end.

The objects are the repository's own manifests (``examples/workloads``, ``examples/bypasses``),
repeated with fresh names up to ``--objects``: Pods, Deployments, StatefulSets, Jobs, allowed and
denied, in multi-document YAML files of 100 objects (and the same as JSON lists). Timed, each
``--repeat`` times (median shown):

- reference: ``yaml`` loading alone (the C loader when PyYAML has it) — the floor for YAML input;
- read: ``manifests.read`` (YAML parse, ``List`` expansion, checks);
- evaluate: ``dryrun.evaluate`` (the engine, and each patch applied to a copy);
- render: ``dryrun.render`` to a table and to JSON;
- CLI: the ``gpu-admission dry-run -o json -f DIR`` process, start-up included, for YAML and JSON
  input, and the start-up alone (one object).

    .venv/bin/python bench/dryrun_throughput.py --objects 5000
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import loadgen  # noqa: E402 - bench/ is not a package; machine() lives there
import records  # noqa: E402 - bench/ is on sys.path (scripts run as bench/<name>.py); one record per run

from policies import settings  # noqa: E402
from webhook.cmdline import manifests
from webhook.commands import dryrun  # noqa: E402

SOURCES = ("examples/workloads", "examples/bypasses")


def corpus(count: int) -> list[dict[str, Any]]:
    """``count`` objects cycled from the example manifests, each with a unique name."""
    seeds: list[dict[str, Any]] = []
    for directory in SOURCES:
        for path in sorted((loadgen.REPO / directory).glob("*.yaml")):
            seeds.extend(d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict) and "kind" in d)
    if not seeds:
        raise SystemExit("no example manifests found")
    objects = []
    for index in range(count):
        obj = copy.deepcopy(seeds[index % len(seeds)])
        obj.setdefault("metadata", {})["name"] = f"{obj['metadata'].get('name', 'obj')}-{index}"
        objects.append(obj)
    return objects


def write(objects: list[dict[str, Any]], directory: pathlib.Path, *, as_json: bool) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for start in range(0, len(objects), 100):
        batch = objects[start : start + 100]
        if as_json:
            (directory / f"batch-{start:06d}.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": batch}))
        else:
            (directory / f"batch-{start:06d}.yaml").write_text(yaml.safe_dump_all(batch, sort_keys=False))


def timed(action: Callable[[], object], *, repeat: int) -> tuple[float, object]:
    """Median seconds over ``repeat`` runs, and the last result."""
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = action()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def cli(paths: list[str]) -> float:
    started = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-m", "webhook.cli", "dry-run", "-o", "json", *(a for p in paths for a in ("-f", p))],
        capture_output=True,
        cwd=loadgen.REPO,
        check=False,
    )
    elapsed = time.perf_counter() - started
    if completed.returncode not in (dryrun.EXIT_ALLOWED, dryrun.EXIT_DENIED):
        raise SystemExit(f"dry-run failed ({completed.returncode}): {completed.stderr.decode()[-2000:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=5000, help="objects in the corpus (default 5000)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per stage; the median is shown (default 3)")
    args = parser.parse_args()
    machine = loadgen.machine()
    objects = corpus(args.objects)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    rows: list[tuple[str, int, float]] = []
    with tempfile.TemporaryDirectory(prefix="gpu-admission-dryrun-") as tmp:
        scratch = pathlib.Path(tmp)
        write(objects, scratch / "yaml", as_json=False)
        write(objects, scratch / "json", as_json=True)
        write(objects[:1], scratch / "one", as_json=False)
        yaml_paths = [str(p) for p in sorted((scratch / "yaml").iterdir())]
        texts = [pathlib.Path(p).read_text() for p in yaml_paths]

        seconds, _ = timed(lambda: [list(yaml.load_all(t, Loader=loader)) for t in texts], repeat=args.repeat)  # noqa: S506 - a safe loader
        rows.append((f"reference: yaml.load_all ({loader.__name__})", len(objects), seconds))
        seconds, documents = timed(lambda: manifests.read(yaml_paths, stdin=io.StringIO()), repeat=args.repeat)
        assert isinstance(documents, list) and len(documents) == len(objects)
        rows.append(("read (YAML parse + checks)", len(documents), seconds))
        config = settings.Settings()
        seconds, outcomes = timed(lambda: dryrun.evaluate(documents, settings=config), repeat=args.repeat)
        assert isinstance(outcomes, list)
        denied = sum(1 for o in outcomes if not o.decision.allowed)
        rows.append((f"evaluate (engine + patch applied; {denied} denied)", len(outcomes), seconds))
        seconds, _ = timed(lambda: dryrun.render(outcomes, output="table"), repeat=args.repeat)
        rows.append(("render table", len(outcomes), seconds))
        seconds, _ = timed(lambda: dryrun.render(outcomes, output="json"), repeat=args.repeat)
        rows.append(("render json", len(outcomes), seconds))
        startup = statistics.median(cli([str(scratch / "one")]) for _ in range(args.repeat))
        rows.append(("CLI start-up (1 object)", 1, startup))
        rows.append(
            (
                "CLI `dry-run -o json -f DIR` on YAML files",
                len(objects),
                statistics.median(cli([str(scratch / "yaml")]) for _ in range(args.repeat)),
            )
        )
        rows.append(
            (
                "CLI `dry-run -o json -f DIR` on JSON files",
                len(objects),
                statistics.median(cli([str(scratch / "json")]) for _ in range(args.repeat)),
            )
        )

    print(
        f"Machine: {machine['cpu']} x{machine['nproc']}, Python {machine['python']}; {machine['date']}; "
        f"load average {machine['loadavg']:.1f} → {os.getloadavg()[0]:.1f}."
    )
    print(f"Command: `.venv/bin/python bench/dryrun_throughput.py --objects {args.objects} --repeat {args.repeat}`\n")
    print("| stage | objects | seconds (median) | objects/s |")
    print("|---|---:|---:|---:|")
    for name, count, seconds in rows:
        print(f"| {name} | {count} | {seconds:.3f} | {count / seconds:,.0f} |")
    rates = {name: round(count / seconds, 1) for name, count, seconds in rows}
    engine = next(v for k, v in rates.items() if k.startswith("evaluate"))
    parse = next(v for k, v in rates.items() if k.startswith("reference"))
    records.write(
        bench="dryrun_throughput",
        inputs=vars(args),
        figures={"objects_per_s": rates, "evaluate_objects_per_s": engine},
        reference={"name": "yaml.load_all (CSafeLoader) on the same objects", "figures": {"evaluate_objects_per_s": parse}},
        headline=records.Headline(
            figure="evaluate_objects_per_s", label="dry-run engine throughput", unit="objects/s", better="higher"
        ),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
