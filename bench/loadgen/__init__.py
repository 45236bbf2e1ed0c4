"""The Python side of the load generator: build it, run it, and measure the server it loads.

The Go program beside this file (``main.go``) does the sending; it is built once into
``~/.cache/gpu-admission/bench/loadgen/`` (never into the repository). ``Server`` starts a server
process and meters it from ``/proc``: CPU seconds (utime + stime of the process and every
descendant, so ``serve --workers N`` is counted whole) and resident memory (VmRSS, summed the same
way, sampled while a run goes on so the peak is seen).

Used by ``compare_opa.py``, ``soak.py`` and ``fuzz_long.py`` (run them from the repository root;
``bench/`` is then on ``sys.path``).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import platform
import shutil
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

import records  # bench/ is on sys.path (see above): the shared machine description

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
CACHE = pathlib.Path(os.environ.get("GPU_ADMISSION_BENCH_CACHE", pathlib.Path.home() / ".cache" / "gpu-admission" / "bench"))
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def binary() -> pathlib.Path:
    """The built load generator, (re)built when a source file is newer than the binary."""
    target = CACHE / "loadgen" / "loadgen"
    sources = [*HERE.glob("*.go"), HERE / "go.mod"]
    if target.exists() and all(s.stat().st_mtime <= target.stat().st_mtime for s in sources):
        return target
    if shutil.which("go") is None:
        raise SystemExit("the load generator needs a Go toolchain (go build) the first time")
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["go", "build", "-o", str(target), "."], cwd=HERE, check=True)
    return target


def run(
    *,
    url: str,
    body: pathlib.Path,
    ca: pathlib.Path,
    seconds: float,
    rate: float = 0.0,
    connections: int = 16,
    warmup: float = 0.0,
    content_type: str = "application/json",
    timeout_s: float = 10.0,
    client_cert: pathlib.Path | None = None,
    client_key: pathlib.Path | None = None,
) -> dict[str, Any]:
    """One load-generator run; its JSON answer (see main.go ``result``)."""
    command = [
        str(binary()),
        "-url",
        url,
        "-body",
        str(body),
        "-ca",
        str(ca),
        "-connections",
        str(connections),
        "-rate",
        str(rate),
        "-duration",
        f"{seconds}s",
        "-warmup",
        f"{warmup}s",
        "-timeout",
        f"{timeout_s}s",
        "-content-type",
        content_type,
    ]
    if client_cert is not None and client_key is not None:
        command += ["-cert", str(client_cert), "-key", str(client_key)]
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise SystemExit(f"loadgen failed ({completed.returncode}): {completed.stderr.strip()}")
    result: dict[str, Any] = json.loads(completed.stdout)
    return result


# --- /proc ------------------------------------------------------------------------------------------


def _stat(pid: int) -> tuple[int, float] | None:
    """(ppid, utime + stime in seconds) of a live process, None when it is gone."""
    try:
        text = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS


def tree(pid: int) -> list[int]:
    """``pid`` and all its live descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = _stat(int(entry))
            if found is not None:
                children.setdefault(found[0], []).append(int(entry))
    result, todo = [], [pid]
    while todo:
        current = todo.pop()
        result.append(current)
        todo.extend(children.get(current, []))
    return result


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and its live descendants."""
    return sum(found[1] for p in tree(pid) if (found := _stat(p)) is not None)


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its live descendants (sum of their RSS)."""
    total = 0
    for p in tree(pid):
        try:
            total += int(pathlib.Path(f"/proc/{p}/statm").read_text().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            pass
    return total


def pss_bytes(pid: int) -> int:
    """Proportional set size of ``pid`` and its live descendants: pages shared between processes
    (a forked worker's copy-on-write pages) counted once in all, unlike a sum of RSS."""
    total = 0
    for p in tree(pid):
        try:
            for line in pathlib.Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
        except (OSError, IndexError, ValueError):
            pass
    return total


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (all cores, all processes) since boot."""
    fields = [int(v) for v in pathlib.Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    guest = sum(fields[8:10]) if len(fields) > 9 else 0  # already counted in user/nice
    return (sum(fields) - idle - guest) / TICKS


@dataclasses.dataclass
class Meter:
    """CPU used and peak RSS (and PSS) of a process tree over a window (``with Meter(pid) as m: ...``)."""

    pid: int
    interval_s: float = 0.2
    cpu_s: float = 0.0
    rss_peak: int = 0
    rss_end: int = 0
    pss_peak: int = 0
    wall_s: float = 0.0
    machine_busy_s: float = 0.0  # every process on the machine, ours included
    _stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _cpu0: float = 0.0
    _busy0: float = 0.0
    _wall0: float = 0.0

    def __enter__(self) -> Meter:
        self._cpu0 = cpu_seconds(self.pid)
        self._busy0 = machine_busy_seconds()
        self._wall0 = time.monotonic()
        self.rss_peak = rss_bytes(self.pid)
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.rss_peak = max(self.rss_peak, rss_bytes(self.pid))
            self.pss_peak = max(self.pss_peak, pss_bytes(self.pid))

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.cpu_s = cpu_seconds(self.pid) - self._cpu0
        self.machine_busy_s = machine_busy_seconds() - self._busy0
        self.wall_s = time.monotonic() - self._wall0
        self.rss_end = rss_bytes(self.pid)
        self.rss_peak = max(self.rss_peak, self.rss_end)

    def others_cores(self, *, client_cpu_s: float = 0.0) -> float:
        """Cores the rest of the machine kept busy meanwhile: not this tree, not the load generator."""
        return max(0.0, (self.machine_busy_s - self.cpu_s - client_cpu_s) / self.wall_s) if self.wall_s else 0.0


# --- servers ----------------------------------------------------------------------------------------


class Server:
    """A server process started from ``argv``, its output in ``log``; stopped on exit."""

    def __init__(
        self, argv: Sequence[str], *, log: pathlib.Path, env: dict[str, str] | None = None, cwd: pathlib.Path = REPO
    ) -> None:
        self.argv = list(argv)
        self.log = log
        self._stream = log.open("w")
        self.process = subprocess.Popen(
            self.argv,
            stdout=self._stream,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_for_line(self, marker: str, *, timeout: float = 30.0) -> str:
        """The first log line containing ``marker`` (polls the log with a deadline)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log.read_text(errors="replace").splitlines():
                if marker in line:
                    return line
            if self.process.poll() is not None:
                raise SystemExit(f"{self.argv[0]} exited with {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.05)
        raise SystemExit(f"{self.argv[0]} did not print {marker!r} in {timeout} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._stream.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def wait_ready(url: str, *, ca: pathlib.Path, server: Server, timeout: float = 30.0) -> None:
    """Poll ``url`` (GET, our CA) until it answers 200, with a deadline."""
    context = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise SystemExit(f"{server.argv[0]} exited with {server.process.returncode}:\n{server.log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, context=context, timeout=2) as answer:
                if answer.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.05)
    raise SystemExit(f"{url} did not answer 200 in {timeout} s")


def machine() -> dict[str, Any]:
    """What the figures were measured on, and how busy it was (load average) when asked."""
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": records.cpu_model(),
        "python": platform.python_version(),
        "loadavg": os.getloadavg()[0],
    }
