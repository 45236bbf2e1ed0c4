"""Load and latency of ``gpu-admission serve``: /mutate and /validate for a typical GPU pod review.

The server runs as a separate process (the real console entry point, TLS, default logging); this
process drives it with an aiohttp client over keep-alive connections at a fixed concurrency. The
reference row is /healthz on the same server and connections: TLS + HTTP + aiohttp cost without
parsing or policy evaluation, so the difference is what admission itself costs.

    .venv/bin/python bench/webhook_load.py --concurrency 16 --duration 10
    .venv/bin/python bench/webhook_load.py --against 8900dc2   # this tree and an earlier commit, one run

With ``--against REF`` the same measurement runs on a server started from a git worktree of REF (same
interpreter, same certificates, same bodies), alternating rounds between the two, and prints the
ratios: throughput, p99, and the server's CPU time per 1,000 reviews (read from /proc, so the load
generator's own CPU on the same cores does not count). The per-review cost is that CPU figure.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import aiohttp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import loadgen  # noqa: E402 - bench/ is not a package; machine() lives there
import records  # noqa: E402 - bench/ is on sys.path (scripts run as bench/<name>.py); one record per run

from webhook.certificates import certfiles  # noqa: E402
from webhook.serving import tls  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
REVIEW = REPO / "tests" / "data" / "reviews" / "pod-create-gpu-mem.json"
ENDPOINTS = ("/healthz", "/mutate", "/validate")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight (default 16)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds measured per endpoint (default 10)")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of unmeasured load first (default 2)")
    parser.add_argument("--server-log-level", default="info", help="the server's --log-level (default info)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--against", metavar="REF", help="also measure a server from git REF, alternating, and print ratios")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds with --against (default 3)")
    parser.add_argument(
        "--review",
        type=pathlib.Path,
        action="append",
        help="AdmissionReview body to send (repeatable; default: the gpu-mem pod create)",
    )
    args = parser.parse_args()
    if args.against:
        return _compare(args)
    with tempfile.TemporaryDirectory(prefix="gpu-admission-bench-") as scratch:
        results = asyncio.run(_bench(pathlib.Path(scratch), args, REPO, _bodies(args)[0][1]))
    machine = loadgen.machine()
    if args.json:
        print(json.dumps({"machine": machine, "concurrency": args.concurrency, "results": results}, indent=2))
    else:
        print(f"# {machine['date']}  {machine['cpu']} x{machine['nproc']}  Python {machine['python']}")
        print(
            f"# concurrency {args.concurrency}, {args.duration:g} s per endpoint after {args.warmup:g} s warm-up, TLS keep-alive"
        )
        print(f"{'endpoint':<10} {'requests':>9} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}")
        for row in results:
            print(
                f"{row['endpoint']:<10} {row['requests']:>9} {row['rps']:>8.0f} {row['p50_ms']:>8.2f} "
                f"{row['p99_ms']:>8.2f} {row['errors']:>7}"
            )
    print("# no record: a record needs the reference of the same run (--against REF)", flush=True)
    return 0 if all(row["errors"] == 0 for row in results) else 1


def _bodies(args: argparse.Namespace) -> list[tuple[str, bytes]]:
    paths = args.review or [REVIEW]
    return [(path.stem, path.read_bytes()) for path in paths]


def _compare(args: argparse.Namespace) -> int:
    """This tree against a worktree of `args.against`, alternating rounds, per review body."""
    with tempfile.TemporaryDirectory(prefix="gpu-admission-bench-") as scratch_dir:
        scratch = pathlib.Path(scratch_dir)
        other = scratch / "against"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(other), args.against], check=True, capture_output=True
        )
        try:
            trees = {"this": REPO, args.against: other}
            figures: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
            for round_ in range(args.rounds):
                order = list(trees.items()) if round_ % 2 == 0 else list(trees.items())[::-1]
                for name, tree in order:
                    for stem, body in _bodies(args):
                        work = scratch / f"{name.replace('/', '_')}-{stem}-{round_}"
                        work.mkdir()
                        for row in asyncio.run(_bench(work, args, tree, body)):
                            figures.setdefault((stem, row["endpoint"], name), []).append(row)
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(other)], check=False, capture_output=True
            )
    machine = loadgen.machine()
    print(f"# {machine['date']}  {machine['cpu']} x{machine['nproc']}  Python {machine['python']}")
    print(
        f"# concurrency {args.concurrency}, {args.duration:g} s per endpoint, {args.rounds} alternating rounds; "
        f"medians; ratio = this tree / {args.against}"
    )
    print(f"{'review':<22} {'endpoint':<10} {'req/s':>14} {'p99 ms':>14} {'CPU s/1k':>16} {'ratio CPU':>9}")
    summary: dict[str, float] = {}
    ours: dict[str, float] = {}
    theirs: dict[str, float] = {}
    for stem, _ in _bodies(args):
        for endpoint in ENDPOINTS:
            this = _median_row(figures[(stem, endpoint, "this")])
            base = _median_row(figures[(stem, endpoint, args.against)])
            ratio = this["cpu_s_per_1k"] / base["cpu_s_per_1k"] if base["cpu_s_per_1k"] else float("nan")
            summary[f"{stem}{endpoint}"] = round(ratio, 3)
            ours[f"{stem}{endpoint}"], theirs[f"{stem}{endpoint}"] = this["cpu_s_per_1k"], base["cpu_s_per_1k"]
            print(
                f"{stem:<22} {endpoint:<10} {this['rps']:>6.0f}/{base['rps']:<7.0f} "
                f"{this['p99_ms']:>6.2f}/{base['p99_ms']:<7.2f} {this['cpu_s_per_1k']:>7.3f}/{base['cpu_s_per_1k']:<8.3f} "
                f"{ratio:>9.3f}"
            )
    print(json.dumps({"cpu_ratio": summary, "against": args.against}))
    first = f"{_bodies(args)[0][0]}/validate"
    records.write(
        bench="webhook_load",
        inputs=vars(args),
        figures={"cpu_s_per_1k": ours[first], "review": first, "cpu_s_per_1k_by_review": ours, "cpu_ratio": summary},
        reference={"name": args.against, "figures": {"cpu_s_per_1k": theirs[first], "cpu_s_per_1k_by_review": theirs}},
        headline=records.Headline(figure="cpu_s_per_1k", label=f"webhook CPU per 1k reviews, {first}", unit="s", better="lower"),
        ratio=summary[first],
    )
    return 0


def _median_row(rows: list[dict[str, Any]]) -> dict[str, float]:
    return {key: statistics.median(row[key] for row in rows) for key in ("rps", "p99_ms", "cpu_s_per_1k")}


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc/PID/stat."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _bench(scratch: pathlib.Path, args: argparse.Namespace, tree: pathlib.Path, body: bytes) -> list[dict[str, Any]]:
    certfiles.generate(out_dir=scratch, hosts=("127.0.0.1",), now=datetime.datetime.now(datetime.UTC))
    log_path, out_path = scratch / "server.log", scratch / "server.out"
    with log_path.open("w") as log, out_path.open("w") as out:
        server = subprocess.Popen(  # noqa: ASYNC220 - starts the server and returns; nothing here waits on it
            [
                sys.executable,
                "-m",
                "webhook.cli",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--tls-cert-file",
                str(scratch / "tls.crt"),
                "--tls-private-key-file",
                str(scratch / "tls.key"),
                "--log-level",
                args.server_log_level,
            ],
            stdout=out,
            stderr=log,
            cwd=tree,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(tree)},
        )
    try:
        port = _wait_for_port(out_path, log_path, server)
        context = tls.client_context(ca_file=str(scratch / "ca.crt"))
        connector = aiohttp.TCPConnector(limit=args.concurrency, ssl=context)
        async with aiohttp.ClientSession(connector=connector, base_url=f"https://127.0.0.1:{port}") as session:
            await _check_answers(session, body)
            results = []
            for endpoint in ENDPOINTS:
                await _load(session, endpoint, body, concurrency=args.concurrency, seconds=args.warmup)
                cpu_before = _cpu_seconds(server.pid)
                row = await _load(session, endpoint, body, concurrency=args.concurrency, seconds=args.duration)
                cpu = _cpu_seconds(server.pid) - cpu_before
                row["cpu_s_per_1k"] = 1000 * cpu / row["requests"] if row["requests"] else 0.0
                results.append(row)
            return results
    finally:
        server.terminate()
        server.wait(timeout=30)


def _wait_for_port(
    out_path: pathlib.Path, log_path: pathlib.Path, server: subprocess.Popen[bytes], *, deadline_s: float = 30.0
) -> int:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for line in out_path.read_text().splitlines():
            if "listening on https://" in line:
                return int(line.rsplit(":", 1)[1])
        if server.poll() is not None:
            raise SystemExit(f"server exited with {server.returncode}:\n{log_path.read_text()}")
        time.sleep(0.05)  # polling a log file for start-up, with a deadline
    raise SystemExit("server did not start in time")


async def _check_answers(session: aiohttp.ClientSession, body: bytes) -> None:
    """Make sure the load measures real work: a patch from /mutate, an allow from /validate."""
    async with session.post("/mutate", data=body) as answer:
        mutated = await answer.json()
    async with session.post("/validate", data=body) as answer:
        validated = await answer.json()
    if "patch" not in mutated["response"] or validated["response"]["allowed"] is not True:
        raise SystemExit(f"unexpected answers: {mutated} {validated}")


async def _load(
    session: aiohttp.ClientSession, endpoint: str, body: bytes, *, concurrency: int, seconds: float
) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds
    headers = {"Content-Type": "application/json"}

    async def worker() -> None:
        nonlocal errors
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            try:
                if endpoint == "/healthz":
                    async with session.get(endpoint) as answer:
                        await answer.read()
                else:
                    async with session.post(endpoint, data=body, headers=headers) as answer:
                        await answer.read()
                ok = answer.status == 200
            except aiohttp.ClientError:
                ok = False
            if ok:
                latencies.append(time.perf_counter() - started)
            else:
                errors += 1

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - began
    cuts = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
    return {
        "endpoint": endpoint,
        "requests": len(latencies),
        "rps": len(latencies) / elapsed,
        "p50_ms": cuts[49] * 1000,
        "p99_ms": cuts[98] * 1000,
        "errors": errors,
    }


if __name__ == "__main__":
    sys.exit(main())
