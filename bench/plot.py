"""Draw each bench's headline ratio over the commits its records name, one PNG per bench.

    .venv/bin/python bench/plot.py [--results bench/results] [--out docs/img/bench]

Reads every record (`records.load`), keeps those with a ratio (ours over the reference's for the
headline figure), and plots the ratio per record in date order, labelled by commit, with the line
at 1 (as fast as the reference) and an arrow saying which way is better. Benches whose records have
no ratio (no reference: the soak, the fuzz run) get no plot. Each PNG carries, in its metadata, a
digest of the points it draws (`points_digest`), so a test can tell a stale plot from a current
one without comparing pixels; the documentation's Benchmarks page shows them
(`python -m docs.generate` lists the PNGs it finds).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a display
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen
import records  # noqa: E402 - bench/ is on sys.path when run as bench/plot.py

OUT = records.REPO / "docs" / "img" / "bench"
DIGEST_KEY = "points_digest"


def series(all_records: Iterable[Mapping[str, Any]]) -> dict[str, list[tuple[str, str, float]]]:
    """Per bench, its (date, commit, ratio) points, oldest first; benches without a ratio left out."""
    found: dict[str, list[tuple[str, str, float]]] = {}
    for record in all_records:
        ratio = record.get("ratio")
        if isinstance(ratio, (int, float)):
            found.setdefault(record["bench"], []).append((record["date"], record["commit"], float(ratio)))
    return {bench: sorted(points) for bench, points in sorted(found.items())}


def digest(points: Sequence[tuple[str, str, float]]) -> str:
    """What a plot draws, in 16 hex digits: its points (date, commit, ratio)."""
    # "2": the drawing marks transcribed points (a change of drawing redraws every plot).
    return hashlib.sha256(json.dumps(["2", *[list(p) for p in points]]).encode()).hexdigest()[:16]


def transcribed(all_records: Iterable[Mapping[str, Any]]) -> set[tuple[str, str]]:
    """The (date, commit) of every record transcribed from prose rather than measured by a run."""
    return {(r["date"], r["commit"]) for r in all_records if r.get("source") != "measured"}


def draw(
    bench: str,
    points: Sequence[tuple[str, str, float]],
    headline: Mapping[str, Any],
    path: pathlib.Path,
    *,
    history: set[tuple[str, str]] | None = None,
) -> None:
    """One PNG: the ratio per record, the line at 1, which way is better; the points in `history`
    (transcribed from prose) hollow and grey, the measured ones filled."""
    figure, axes = plt.subplots(figsize=(7, 3.2), dpi=100)
    xs = list(range(len(points)))
    ys = [p[2] for p in points]
    axes.plot(xs, ys, color="#3f51b5")
    old = [(x, y) for x, y, p in zip(xs, ys, points, strict=True) if (p[0], p[1]) in (history or set())]
    new = [(x, y) for x, y, p in zip(xs, ys, points, strict=True) if (p[0], p[1]) not in (history or set())]
    if old:
        axes.plot(
            [x for x, _ in old],
            [y for _, y in old],
            linestyle="none",
            marker="o",
            markerfacecolor="white",
            color="#9e9e9e",
            label="transcribed from prose",
        )
    if new:
        axes.plot(
            [x for x, _ in new], [y for _, y in new], linestyle="none", marker="o", color="#3f51b5", label="measured by a run"
        )
    axes.legend(fontsize=7, loc="lower right")
    axes.axhline(1.0, color="#9e9e9e", linestyle="--", linewidth=1)
    for x, (_date, _commit, ratio) in zip(xs, points, strict=True):
        axes.annotate(f"{ratio:.2f}", (x, ratio), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    axes.set_xticks(xs, [f"{commit}\n{date[:10]}" for date, commit, _ in points], fontsize=7)
    axes.set_xlim(-0.5, max(len(points) - 0.5, 0.5))
    top = max([*ys, 1.0]) * 1.25
    axes.set_ylim(0, top)
    better = "lower is better" if headline.get("better") == "lower" else "higher is better"
    axes.set_ylabel("ours / reference")
    axes.set_title(f"{bench}: {headline.get('label', '')} ({better})", fontsize=9)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(
        path, format="png", metadata={"Title": bench, "Description": f"{DIGEST_KEY}={digest(points)}", "Software": None}
    )
    plt.close(figure)


def written_digest(path: pathlib.Path) -> str | None:
    """The points digest a PNG written by `draw` carries, None when it carries none."""
    data = path.read_bytes()
    marker = f"{DIGEST_KEY}=".encode()
    at = data.find(marker)
    if at < 0:
        return None
    return data[at + len(marker) : at + len(marker) + 16].decode()


def plot(all_records: Sequence[Mapping[str, Any]], *, out: pathlib.Path) -> list[pathlib.Path]:
    """Draw every bench's plot into `out`; remove PNGs of benches that no longer have one."""
    latest = {r["bench"]: r for r in records.latest(all_records)}
    history = transcribed(all_records)
    written = []
    for bench, points in series(all_records).items():
        path = out / f"{bench}.png"
        if not path.exists() or written_digest(path) != digest(points):
            draw(bench, points, latest[bench]["headline"], path, history=history)
        written.append(path)
    for old in out.glob("*.png"):
        if old not in written:
            old.unlink()
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/plot.py", description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--results", type=pathlib.Path, default=records.RESULTS, help="where the records are")
    parser.add_argument("--out", type=pathlib.Path, default=OUT, help="where the PNGs go")
    args = parser.parse_args(argv)
    for path in plot(records.load(args.results), out=args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
