"""`gpu-admission serve` as a child process, for the tests that run it whole (``--workers``)."""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping


def serve(tls_dir: pathlib.Path, *extra: str, out: pathlib.Path, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    """The server on 127.0.0.1 and a free port with the pair in ``tls_dir``; stdout and stderr go to ``out``."""
    with out.open("w") as stream:
        return subprocess.Popen(
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
                str(tls_dir / "tls.crt"),
                "--tls-private-key-file",
                str(tls_dir / "tls.key"),
                *extra,
            ],
            stdout=stream,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )


def until(predicate: Callable[[], object], *, what: str, timeout: float) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling child processes and their output, with a deadline


def stop(process: subprocess.Popen[str]) -> None:
    """SIGTERM to a server still running; SIGKILL if it has not stopped 30 s later."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
