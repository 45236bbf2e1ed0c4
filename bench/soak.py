"""Soak: ``gpu-admission serve`` at a steady rate for a long time; memory must stay flat, no errors.

The server runs as its own process (TLS, default ``info`` logging to a file, as deployed). The Go
load generator sends open-loop arrivals at ``--rate`` per second, one minute at a time, cycling
through three review bodies (a small GPU pod, a 50 KB pod, and a denied pod) and both endpoints,
so every code path (patch, allow, deny) runs all along. After each minute: that minute's achieved
rate, errors, p50/p99/max latency, the server's CPU and RSS. At the end: RSS first / last / peak,
the growth after warm-up with its least-squares slope, and the drift of each body's own minutes
(RSS follows what a minute served: large bodies leave a few MiB more), total requests and errors.

    .venv/bin/python bench/soak.py --minutes 30 --rate 200 > soak.txt
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import re
import statistics
import sys
import tempfile
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import compare_opa  # noqa: E402 - bench/ is not a package; the review bodies live there
import loadgen  # noqa: E402
import records  # noqa: E402 - bench/ is on sys.path (scripts run as bench/<name>.py); one record per run

from webhook.certificates import certfiles  # noqa: E402

_STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")


def bodies(directory: pathlib.Path) -> list[tuple[str, str, pathlib.Path]]:
    """(label, endpoint, file) cycled minute by minute."""
    denied = compare_opa.small_pod()
    denied["spec"]["containers"][0]["env"].append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})
    files = {}
    for name, obj in (("small", compare_opa.small_pod()), ("large", compare_opa.large_pod()), ("denied", denied)):
        files[name] = directory / f"{name}.json"
        files[name].write_text(json.dumps(compare_opa.review(obj), separators=(",", ":")))
    return [
        ("small", "/mutate", files["small"]),
        ("large", "/validate", files["large"]),
        ("denied", "/validate", files["denied"]),
        ("small", "/validate", files["small"]),
        ("large", "/mutate", files["large"]),
    ]


def longest_log_gap(log: pathlib.Path) -> float:
    """Seconds of the longest silence between two timestamped lines of the server's log."""
    longest, previous = 0.0, None
    with log.open(errors="replace") as stream:
        for line in stream:
            found = _STAMP.match(line)
            if not found:
                continue
            # Only the gaps between stamps count: read as UTC, so a clock change in the machine's zone
            # (daylight saving) cannot make one.
            when = datetime.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=datetime.UTC)
            stamp = when.timestamp() + int(found.group(2)) / 1000
            if previous is not None:
                longest = max(longest, stamp - previous)
            previous = stamp
    return longest


def slope_kib_per_minute(points: list[tuple[float, int]]) -> float:
    if len(points) < 2:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] / 1024 for p in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    denominator = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / denominator if denominator else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=30, help="how long (default 30)")
    parser.add_argument("--rate", type=float, default=200.0, help="arrivals per second (default 200)")
    parser.add_argument(
        "--workers", type=int, default=1, help="serve --workers (default 1: one process, the memory figure per process)"
    )
    parser.add_argument("--warmup-minutes", type=int, default=3, help="minutes left out of the growth figure (default 3)")
    parser.add_argument("--json", metavar="FILE", help="also write every minute as JSON here")
    parser.add_argument(
        "--segment-seconds", type=float, default=60.0, help=argparse.SUPPRESS
    )  # shorter "minutes" to try the script
    args = parser.parse_args()
    started = loadgen.machine()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpu-admission-soak-") as tmp:
        scratch = pathlib.Path(tmp)
        certfiles.generate(out_dir=scratch / "tls", hosts=("127.0.0.1",), now=datetime.datetime.now(datetime.UTC))
        cycle = bodies(scratch)
        server, url = compare_opa.start(f"ours{args.workers}", scratch, opa=None)
        base = url.rsplit("/", 1)[0]
        try:
            rss0 = loadgen.rss_bytes(server.pid)
            print(
                f"# soak {args.minutes} min at {args.rate:g}/s, serve --workers {args.workers}; {started['date']}; "
                f"{started['cpu']} x{started['nproc']}; idle RSS {rss0 / 2**20:.1f} MiB",
                flush=True,
            )
            print(
                f"{'min':>3} {'body':<6} {'endpoint':<9} {'achieved/s':>10} {'errors':>6} {'late':>5} {'p50 ms':>7} {'p99 ms':>8} "
                f"{'max ms':>8} {'cpu s':>6} {'RSS MiB':>8} {'load':>5}",
                flush=True,
            )
            for minute in range(1, args.minutes + 1):
                label, endpoint, body = cycle[(minute - 1) % len(cycle)]
                with loadgen.Meter(server.pid) as meter:
                    result = loadgen.run(
                        url=base + endpoint,
                        body=body,
                        ca=scratch / "tls" / "ca.crt",
                        seconds=args.segment_seconds,
                        rate=args.rate,
                        connections=32,
                    )
                row = {
                    "minute": minute,
                    "body": label,
                    "endpoint": endpoint,
                    "achieved": result["achieved_rate"],
                    "ok": result["ok"],
                    "errors": result["errors"],
                    "late": result["late"],
                    "statuses": result["statuses"],
                    "p50_ms": result["p50_ms"],
                    "p99_ms": result["p99_ms"],
                    "max_ms": result["max_ms"],
                    "cpu_s": meter.cpu_s,
                    "rss": meter.rss_end,
                    "rss_peak": meter.rss_peak,
                    "load": os.getloadavg()[0],
                }
                rows.append(row)
                print(
                    f"{minute:>3} {label:<6} {endpoint:<9} {row['achieved']:>10.1f} {row['errors']:>6} {row['late']:>5} "
                    f"{row['p50_ms']:>7.2f} {row['p99_ms']:>8.2f} {row['max_ms']:>8.1f} {row['cpu_s']:>6.1f} "
                    f"{row['rss'] / 2**20:>8.1f} {row['load']:>5.1f}",
                    flush=True,
                )
                if server.process.poll() is not None:
                    print(f"the server exited with {server.process.returncode}", flush=True)
                    return 1
            log_bytes = server.log.stat().st_size
            longest_gap = longest_log_gap(server.log)
        finally:
            server.stop()
    settled = [(r["minute"], r["rss"]) for r in rows if r["minute"] > args.warmup_minutes]
    total_ok = sum(r["ok"] for r in rows)
    total_errors = sum(r["errors"] + r["late"] for r in rows)
    p99s = [r["p99_ms"] for r in rows]
    summary = {
        "requests": total_ok + total_errors,
        "errors": total_errors,
        "rss_idle_mib": rss0 / 2**20,
        "rss_first_mib": rows[0]["rss"] / 2**20,
        "rss_last_mib": rows[-1]["rss"] / 2**20,
        "rss_peak_mib": max(r["rss_peak"] for r in rows) / 2**20,
        "rss_growth_after_warmup_mib": (settled[-1][1] - settled[0][1]) / 2**20 if settled else 0.0,
        "rss_slope_kib_per_min": slope_kib_per_minute(settled),
        "p50_ms_median_of_minutes": statistics.median(r["p50_ms"] for r in rows),
        "p99_ms_median_of_minutes": statistics.median(p99s),
        "p99_ms_worst_minute": max(p99s),
        "max_ms": max(r["max_ms"] for r in rows),
        "cpu_s_per_1k": sum(r["cpu_s"] for r in rows) / max(total_ok, 1) * 1000,
        "server_log_mib": log_bytes / 2**20,
        # The server logs every review; the longest silence between two log lines bounds how long
        # its event loop ever stood still, telling a server stall from a client or a neighbour.
        "server_longest_log_gap_s": longest_gap,
        "load_start": started["loadavg"],
        "load_end": os.getloadavg()[0],
    }
    # Memory per body and endpoint (each minute's RSS depends on what it served): the change from
    # its first minute after warm-up to its last; growth would show in every one of them.
    drift: dict[str, float] = {}
    for row in rows:
        if row["minute"] > args.warmup_minutes:
            key = f"{row['body']} {row['endpoint']}"
            first = drift.setdefault(key + " first", row["rss"] / 2**20)
            drift[key] = row["rss"] / 2**20 - first
    summary["rss_drift_same_traffic_mib"] = {k: round(v, 2) for k, v in drift.items() if not k.endswith(" first")}
    print("# summary " + json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in summary.items()}), flush=True)
    records.write(
        bench="soak",
        inputs=vars(args),
        figures=summary,
        headline=records.Headline(
            figure="rss_growth_after_warmup_mib", label="RSS growth at a steady rate", unit="MiB", better="lower"
        ),
    )
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"machine": started, "rows": rows, "summary": summary}, indent=2))
    return 0 if total_errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
