"""``gpu-admission serve --workers N``: N processes on one port, replaced when one dies, stopped together."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest

from tests.unit.webhook import childserver


def _ports(out: pathlib.Path) -> list[int]:
    return [int(p) for p in re.findall(r"listening on https://127\.0\.0\.1:(\d+)", out.read_text())]


def _children(pid: int) -> set[int]:
    found = set()
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def _ready(port: int, tls_dir: pathlib.Path) -> bool:
    context = ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=context, timeout=5) as answer:
        return bool(answer.status == 200)


@pytest.fixture
def two_workers(tls_dir: pathlib.Path, tmp_path: pathlib.Path) -> Iterator[tuple[subprocess.Popen[str], pathlib.Path]]:
    out = tmp_path / "serve.out"
    process = childserver.serve(tls_dir, "--workers", "2", out=out)
    try:
        childserver.until(lambda: len(_ports(out)) >= 2, what="two workers listening", timeout=30)
        yield process, out
    finally:
        childserver.stop(process)


def test_two_workers_listen_on_one_port_and_answer(
    two_workers: tuple[subprocess.Popen[str], pathlib.Path], tls_dir: pathlib.Path
) -> None:
    process, out = two_workers
    ports = _ports(out)
    assert len(set(ports)) == 1 and ports[0] != 0
    assert len(_children(process.pid)) == 2
    assert all(_ready(ports[0], tls_dir) for _ in range(20))


def test_a_worker_that_dies_is_replaced_and_the_port_keeps_answering(
    two_workers: tuple[subprocess.Popen[str], pathlib.Path], tls_dir: pathlib.Path
) -> None:
    process, out = two_workers
    before = _children(process.pid)
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    childserver.until(
        lambda: len(_children(process.pid) - {victim}) == 2 and len(_ports(out)) >= 3, what="a replacement worker", timeout=30
    )
    assert _ready(_ports(out)[0], tls_dir)
    assert "exited (status -9); starting another" in out.read_text()


def test_sigterm_stops_every_worker_and_the_supervisor(two_workers: tuple[subprocess.Popen[str], pathlib.Path]) -> None:
    process, _ = two_workers
    workers = _children(process.pid)
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    assert not any(
        pathlib.Path(f"/proc/{pid}").exists() and "Z" not in pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2]
        for pid in workers
    )


def test_workers_do_not_outlive_a_supervisor_killed_outright(two_workers: tuple[subprocess.Popen[str], pathlib.Path]) -> None:
    process, _ = two_workers
    workers = _children(process.pid)
    process.kill()
    process.wait(10)
    childserver.until(lambda: not any(_running(pid) for pid in workers), what="the workers to stop", timeout=30)


def _running(pid: int) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def test_a_missing_key_stops_the_supervisor_with_one_error_line(tls_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--workers",
            "2",
            "--tls-cert-file",
            str(tls_dir / "tls.crt"),
            "--tls-private-key-file",
            str(tmp_path / "missing.key"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 2 and completed.stderr.count("gpu-admission: error:") == 1, completed.stderr


def test_a_key_that_does_not_load_stops_every_worker_with_its_status(tls_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    (tmp_path / "tls.key").write_text("not a key")
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--workers",
            "2",
            "--tls-cert-file",
            str(tls_dir / "tls.crt"),
            "--tls-private-key-file",
            str(tmp_path / "tls.key"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 2 and "gpu-admission: error:" in completed.stderr, completed.stderr


def test_workers_must_be_positive(tls_dir: pathlib.Path) -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "serve",
            "--port",
            "0",
            "--workers",
            "0",
            "--tls-cert-file",
            str(tls_dir / "tls.crt"),
            "--tls-private-key-file",
            str(tls_dir / "tls.key"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 2 and "--workers must be at least 1" in completed.stderr


def _maps(pid: int) -> str:
    return pathlib.Path(f"/proc/{pid}/maps").read_text()


def test_the_supervisor_holds_none_of_the_application_once_its_workers_run(
    two_workers: tuple[subprocess.Popen[str], pathlib.Path], tls_dir: pathlib.Path
) -> None:
    """The first workers are forked (sharing the imported pages); the supervisor then becomes the
    small one (same pid): no aiohttp or cryptography mapped, only the standard library."""
    process, out = two_workers
    workers = _children(process.pid)
    assert b"smallsupervisor.py" in pathlib.Path(f"/proc/{process.pid}/cmdline").read_bytes()
    assert "site-packages" not in _maps(process.pid)
    assert all("site-packages" in _maps(pid) for pid in workers)
    # A replacement is the serve command run afresh: it answers on the same port.
    victim = min(workers)
    os.kill(victim, signal.SIGKILL)
    childserver.until(
        lambda: len(_children(process.pid) - {victim}) == 2 and len(_ports(out)) >= 3, what="a replacement worker", timeout=30
    )
    replacement = (_children(process.pid) - workers).pop()
    assert b"--workers\x001\x00--reuse-port" in pathlib.Path(f"/proc/{replacement}/cmdline").read_bytes()
    assert set(_ports(out)) == {_ports(out)[0]} and _ready(_ports(out)[0], tls_dir)


def test_the_scratch_metrics_directory_goes_with_the_small_supervisor(tls_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "serve.out"
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    process = childserver.serve(tls_dir, "--workers", "2", out=out, env=env)
    try:
        childserver.until(lambda: len(_ports(out)) >= 2, what="two workers listening", timeout=30)
        # The small supervisor was exec'd after serve set the variable: its environment has it.
        environ = pathlib.Path(f"/proc/{process.pid}/environ").read_bytes().split(b"\0")
        directory = pathlib.Path(
            next(e for e in environ if e.startswith(b"PROMETHEUS_MULTIPROC_DIR=")).split(b"=", 1)[1].decode()
        )
        assert directory.is_dir()
    finally:
        childserver.stop(process)
    assert process.returncode == 0 and not directory.exists()
