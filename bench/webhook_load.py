"""Load and latency of ``gpu-admission serve``: /mutate and /validate for a typical GPU pod review.

The server runs as a separate process (the real console entry point, TLS, default logging); this
process drives it with an aiohttp client over keep-alive connections at a fixed concurrency. The
reference row is /healthz on the same server and connections: TLS + HTTP + aiohttp cost without
parsing or policy evaluation, so the difference is what admission itself costs.

    .venv/bin/python bench/webhook_load.py --concurrency 16 --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import aiohttp

from webhook import certfiles, tls

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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpu-admission-bench-") as scratch:
        results = asyncio.run(_bench(pathlib.Path(scratch), args))
    machine = _machine()
    if args.json:
        print(json.dumps({"machine": machine, "concurrency": args.concurrency, "results": results}, indent=2))
    else:
        print(f"# {machine['date']}  {machine['cpu']} x{machine['nproc']}  Python {machine['python']}")
        print(f"# concurrency {args.concurrency}, {args.duration:g} s per endpoint after {args.warmup:g} s warm-up, TLS keep-alive")
        print(f"{'endpoint':<10} {'requests':>9} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}")
        for row in results:
            print(
                f"{row['endpoint']:<10} {row['requests']:>9} {row['rps']:>8.0f} {row['p50_ms']:>8.2f} "
                f"{row['p99_ms']:>8.2f} {row['errors']:>7}"
            )
    return 0 if all(row["errors"] == 0 for row in results) else 1


async def _bench(scratch: pathlib.Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    certfiles.generate(out_dir=scratch, hosts=("127.0.0.1",), now=datetime.datetime.now(datetime.UTC))
    log_path, out_path = scratch / "server.log", scratch / "server.out"
    with log_path.open("w") as log, out_path.open("w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "webhook.cli", "serve", "--host", "127.0.0.1", "--port", "0",
             "--tls-cert-file", str(scratch / "tls.crt"), "--tls-private-key-file", str(scratch / "tls.key"),
             "--log-level", args.server_log_level],
            stdout=out, stderr=log, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        port = _wait_for_port(out_path, log_path, server)
        context = tls.client_context(ca_file=str(scratch / "ca.crt"))
        body = REVIEW.read_bytes()
        connector = aiohttp.TCPConnector(limit=args.concurrency, ssl=context)
        async with aiohttp.ClientSession(connector=connector, base_url=f"https://127.0.0.1:{port}") as session:
            await _check_answers(session, body)
            results = []
            for endpoint in ENDPOINTS:
                await _load(session, endpoint, body, concurrency=args.concurrency, seconds=args.warmup)
                results.append(await _load(session, endpoint, body, concurrency=args.concurrency, seconds=args.duration))
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


def _machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "python": platform.python_version(),
    }


if __name__ == "__main__":
    sys.exit(main())
