"""``serve --workers N`` metrics: every scrape, whichever worker answers it, counts every review.

Each worker writes its values into the run's multi-process directory and a scrape merges them all,
so successive scrapes never go back (the hand-written registry answered 5, 5, 15, 5, ...).
"""

from __future__ import annotations

import os
import pathlib
import re
import signal
import ssl
import subprocess
import urllib.request
from collections.abc import Iterator

import pytest

from tests.unit.webhook import childserver
from webhook.serving import metrics

REVIEW = pathlib.Path(__file__).resolve().parents[2] / "data" / "reviews" / "pod-create-gpu-mem.json"
REVIEWS = 24


@pytest.fixture
def served(tls_dir: pathlib.Path, tmp_path: pathlib.Path) -> Iterator[tuple[subprocess.Popen[str], pathlib.Path, pathlib.Path]]:
    directory = tmp_path / "multiproc"
    directory.mkdir()
    # An earlier run's counts, which must not add to this run's.
    (directory / "counter_999999.db").write_bytes(b"\0" * 64)
    out = tmp_path / "serve.out"
    env = {**os.environ, metrics.MULTIPROC_ENV: str(directory)}
    process = childserver.serve(tls_dir, "--metrics-port", "0", "--workers", "2", out=out, env=env)
    try:
        childserver.until(
            lambda: len(_found(out, "listening on https")) >= 2 and len(_found(out, "metrics on http")) >= 2,
            what="two workers",
            timeout=60,
        )
        yield process, out, directory
    finally:
        childserver.stop(process)


def _found(out: pathlib.Path, prefix: str) -> list[int]:
    return [int(p) for p in re.findall(prefix + r"://127\.0\.0\.1:(\d+)", out.read_text())]


def _context(tls_dir: pathlib.Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))


def _review(port: int, tls_dir: pathlib.Path) -> None:
    request = urllib.request.Request(
        f"https://127.0.0.1:{port}/validate", data=REVIEW.read_bytes(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, context=_context(tls_dir), timeout=10) as answer:  # a new connection each
        assert answer.status == 200


def _scrape(url: str, tls_dir: pathlib.Path) -> str:
    context = _context(tls_dir) if url.startswith("https") else None
    with urllib.request.urlopen(url, context=context, timeout=10) as answer:
        assert answer.headers["Content-Type"] == metrics.CONTENT_TYPE
        return str(answer.read().decode())


def _reviews_counted(text: str) -> float:
    found = metrics.samples(text)
    return sum(
        v for (name, labels), v in found.items() if name == "gpu_admission_reviews_total" and ("endpoint", "validate") in labels
    )


def _pids_answering(directory: pathlib.Path) -> set[str]:
    return {path.stem.rsplit("_", 1)[1] for path in directory.glob("counter_*.db")}


def test_every_scrape_counts_every_review_whichever_worker_answers(
    served: tuple[subprocess.Popen[str], pathlib.Path, pathlib.Path], tls_dir: pathlib.Path
) -> None:
    process, out, directory = served
    port, plain = _found(out, "listening on https")[0], _found(out, "metrics on http")[0]
    assert "999999" not in _pids_answering(directory)  # the stale file was removed at start
    for _ in range(REVIEWS):
        _review(port, tls_dir)
    scrapes = [_scrape(f"https://127.0.0.1:{port}/metrics", tls_dir) for _ in range(8)]
    scrapes += [_scrape(f"http://127.0.0.1:{plain}/metrics", tls_dir) for _ in range(8)]
    assert [_reviews_counted(text) for text in scrapes] == [REVIEWS] * len(scrapes)
    last = metrics.samples(scrapes[-1])
    latency = sum(
        v
        for (name, labels), v in last.items()
        if name == "gpu_admission_review_duration_seconds_count"
        and ("operation", "CREATE") in labels
        and ("kind", "Pod") in labels
    )
    assert latency == REVIEWS
    assert last[("gpu_admission_reviews_in_flight", frozenset({("endpoint", "validate")}))] == 0
    assert last[("gpu_admission_workers", frozenset())] == 2
    assert last[("process_cpu_seconds_total", frozenset())] > 0
    assert any(name == metrics.BUILD_INFO for name, _ in last)


def test_counts_survive_a_worker_that_is_replaced(
    served: tuple[subprocess.Popen[str], pathlib.Path, pathlib.Path], tls_dir: pathlib.Path
) -> None:
    process, out, directory = served
    port = _found(out, "listening on https")[0]
    for _ in range(REVIEWS):
        _review(port, tls_dir)
    cpu_before = metrics.sample(_scrape(f"https://127.0.0.1:{port}/metrics", tls_dir), "process_cpu_seconds_total")
    victim = int(sorted(_pids_answering(directory))[0])
    os.kill(victim, signal.SIGKILL)
    childserver.until(lambda: len(_found(out, "listening on https")) >= 3, what="a replacement worker", timeout=60)
    for _ in range(6):
        text = _scrape(f"https://127.0.0.1:{port}/metrics", tls_dir)
        assert _reviews_counted(text) == REVIEWS
        assert (metrics.sample(text, "process_cpu_seconds_total") or 0) >= (cpu_before or 0)  # a counter: never back
        assert metrics.sample(text, "gpu_admission_workers") == 2
