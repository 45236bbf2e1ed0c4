"""The supervisor ``serve --workers N`` becomes once its first workers run: no application in it.

``workers.supervise`` forks the first workers from the ``serve`` process, so that they share the
pages of everything it imported, and then replaces itself (``execv``: same pid, so the workers'
parent and their PR_SET_PDEATHSIG stay as they were) with this script, run by path with ``-I -S``
and importing a few standard modules only. The imported heap then lives in the workers alone, not
a third time in an idle supervisor (bench/README.md, "Webhook against OPA: first-seen pods and
memory"). It does what the forking supervisor did (``workers.supervise``): forwards SIGTERM,
SIGINT and SIGHUP to every worker, reaps them, replaces one that dies unless it failed at start,
and exits with the status that ends the tree. A worker it starts is the ``serve`` command line
run afresh with ``--workers 1`` and the reserved ports (``state["argv"]``).

Its state comes as one JSON argument: the workers (pid, start time on the monotonic clock), the
reserved sockets' descriptors (kept open, so no other process takes the ports), the signals
already asked for, the worker command line, a directory to remove at exit, the metrics directory
and the log format.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

FAST_FAILURE_S = 5.0
_POLL_S = 0.2
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_LIVE_GAUGE_PREFIX = "gauge_live"  # prometheus_client's live* gauge files, one per process
_LOGGER = "webhook.serving.workers"  # the lines read as the forking supervisor's did


class Supervisor:
    def __init__(self, state: dict[str, object]) -> None:
        self.workers: dict[int, float] = {int(pid): float(started) for pid, started in state["workers"]}  # type: ignore[attr-defined]
        self.fds: list[int] = list(state["fds"])  # type: ignore[call-overload]
        self.stopping: list[int] = list(state["stopping"])  # type: ignore[call-overload]
        self.argv: list[str] = list(state["argv"])  # type: ignore[call-overload]
        self.metrics_dir = str(state.get("metrics_dir") or "")
        self.log_json = state.get("log_format") == "json"
        self.status = 0
        self.pid = os.getpid()

    def log(self, level: str, message: str) -> None:
        """One line in the format of the ``serve`` this replaced (``webhook.cmdline.flags``)."""
        now = time.time()
        if self.log_json:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}+00:00"
            line = json.dumps({"time": stamp, "level": level.lower(), "logger": _LOGGER, "message": message, "uid": "-"})
        else:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now % 1 * 1000):03d}"
            line = f"{stamp} {level} {_LOGGER} {message}"
        print(line, file=sys.stderr, flush=True)

    def forward(self, signum: int, _frame: object) -> None:
        if signum != signal.SIGHUP:
            self.stopping.append(signum)
        for pid in self.workers:
            _signal(pid, signum)

    def start(self) -> int:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                os.setpgid(0, 0)
                for signum in _FORWARDED:
                    signal.signal(signum, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
                _stop_with(parent=self.pid)
                for fd in self.fds:
                    os.close(fd)
                os.execv(self.argv[0], self.argv)
            finally:
                os._exit(127)
        self.workers[pid] = time.monotonic()
        return pid

    def watch(self) -> int:
        while self.workers:
            try:
                pid, raw = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                pid, raw = 0, 0
            if pid == 0:
                time.sleep(_POLL_S)  # a supervisor's idle wait for children; signals interrupt it
                continue
            if pid not in self.workers:
                continue
            started = self.workers.pop(pid)
            self.mark_dead(pid)
            code = os.waitstatus_to_exitcode(raw)
            if self.stopping:
                self.status = self.status or (code if code > 0 else 0)
                continue
            if code > 0 and time.monotonic() - started < FAST_FAILURE_S:
                self.log("ERROR", f"uid=- worker {pid} failed at start (status {code}); stopping the others")
                self.status = code
                self.stopping.append(signal.SIGTERM)
                for other in self.workers:
                    _signal(other, signal.SIGTERM)
                continue
            self.log("WARNING", f"uid=- worker {pid} exited (status {code}); starting another")
            self.start()
        return self.status

    def mark_dead(self, pid: int) -> None:
        """A reaped worker's ``live*`` gauges stop counting (``prometheus_client.multiprocess.
        mark_process_dead``, which ``metrics.worker_exited`` calls, without importing it)."""
        if not self.metrics_dir:
            return
        try:
            names = os.listdir(self.metrics_dir)
        except OSError:
            return
        for name in names:
            if name.startswith(_LIVE_GAUGE_PREFIX) and name.endswith(f"_{pid}.db"):
                try:
                    os.remove(os.path.join(self.metrics_dir, name))
                except FileNotFoundError:
                    pass


def _stop_with(*, parent: int) -> None:
    """The kernel sends this worker SIGTERM when the supervisor dies (as ``workers._stop_with``)."""
    import ctypes  # noqa: PLC0415 - in the forked child only, which execs right after
    import ctypes.util  # noqa: PLC0415

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def main(argv: list[str]) -> int:
    state = json.loads(argv[0])
    supervisor = Supervisor(state)
    for fd in supervisor.fds:
        os.set_inheritable(fd, False)  # kept here only; a worker started afresh binds its own
    for signum in _FORWARDED:
        signal.signal(signum, supervisor.forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)  # blocked across the exec: none lost
    try:
        return supervisor.watch()
    finally:
        for fd in supervisor.fds:
            os.close(fd)
        if state.get("remove_at_exit"):
            import shutil  # noqa: PLC0415 - at exit only

            shutil.rmtree(state["remove_at_exit"], ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
