"""Several ``serve`` processes on one port (``serve --workers N``): the kernel spreads connections.

One Python process evaluates reviews on one core. With ``--workers N`` the ``serve`` process
becomes a small supervisor that forks N workers before any event loop or thread exists; each
worker is an ordinary ``serve`` bound with SO_REUSEPORT to the same address, so the kernel
balances incoming connections between them (by connection, which suits kube-apiserver's pool
of kept-alive connections). Workers share nothing at run time; each reloads certificates and
drains on its own, exactly as a single ``serve`` does.

Port 0: the supervisor binds a SO_REUSEPORT socket to let the kernel choose the port and keeps it
bound but not listening (such a socket gets no connections), so every worker binds that port and
no other process can take it in between. Every worker prints its own ``listening on`` line.

Signals: workers run in their own process group, so a terminal's Ctrl-C reaches the supervisor
alone; it passes SIGTERM, SIGINT and SIGHUP on to every worker and exits when they have all
exited. A supervisor that is killed outright takes its workers with it (the kernel sends them
SIGTERM: PR_SET_PDEATHSIG). A worker that dies while no stop was asked for is started again, unless it exited with an
error status within ``FAST_FAILURE_S`` of its start (bad certificate, port taken: a restart would
fail the same way); then the others are stopped and the supervisor exits with the worker's status.
A worker killed by a signal (an OOM kill) is always replaced.

Memory: run as the ``serve`` command, the supervisor forks the first workers (they share the pages
of everything imported) and then execs ``webhook.serving.smallsupervisor`` in its place (same pid),
which does all of the above with the standard library alone; a replacement worker is then the
``serve`` command run afresh. Called from within another program, it stays the forking supervisor.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import dataclasses
import json
import logging
import os
import pathlib
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

FAST_FAILURE_S = 5.0
_POLL_S = 0.2
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclasses.dataclass
class _Worker:
    pid: int
    started: float


def reserve_port(host: str, port: int) -> socket.socket:
    """A bound, not listening SO_REUSEPORT socket on ``host:port`` (``port`` 0: the kernel picks)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def supervise(
    args: argparse.Namespace,
    *,
    serve_one: Callable[[argparse.Namespace], int],
    on_exit: Callable[[int], None] = lambda _pid: None,
    reexec: Sequence[str] | None = None,
    remove_at_exit: str | None = None,
) -> int:
    """Run ``args.workers`` copies of ``serve_one`` on one port until they stop; the exit status.

    ``args.metrics_port``, where set, is reserved the same way (every worker serves the merged
    metrics there); ``on_exit`` hears each worker's pid once it is reaped.

    ``reexec``: the command line of this ``serve`` (interpreter first). Given, the supervisor
    forks the first workers from this process, so that they share the pages of everything
    imported so far, and then replaces itself (``execv``, same pid, so the workers' parent stays
    the same) with the small supervisor of ``main`` below, which imports none of the application:
    the imported heap then lives in the workers only, not a third time in an idle supervisor
    (about 10 MiB of PSS: bench/README.md). A worker started later is that command line run
    afresh with ``--workers 1`` and the reserved ports. ``remove_at_exit``: a directory the small
    supervisor removes when it exits (the metrics files of a run without a directory of its own).
    """
    reserved = _reserve(args.host, args.port)
    port = reserved.getsockname()[1]
    metrics_port = getattr(args, "metrics_port", None)
    reserved_metrics = _reserve(args.host, metrics_port) if metrics_port is not None else None
    if reserved_metrics is not None:
        metrics_port = reserved_metrics.getsockname()[1]
    child_args = argparse.Namespace(
        **{**vars(args), "workers": 1, "reuse_port": True, "port": port, "metrics_port": metrics_port}
    )
    sockets = [s for s in (reserved, reserved_metrics) if s is not None]
    supervisor = os.getpid()

    def start() -> _Worker:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the worker: its own process group, default signal handling, then serve
            status = 1
            try:
                _become_worker(parent=supervisor, sockets=sockets)
                status = _run_worker(serve_one, child_args)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)
        return _Worker(pid=pid, started=time.monotonic())

    tree = _Tree(start=start, on_exit=on_exit)
    previous = {signum: signal.signal(signum, tree.forward) for signum in _FORWARDED}
    try:
        for _ in range(args.workers):
            tree.add(start())
        log.info("uid=- %d workers on port %d: %s", args.workers, port, " ".join(str(p) for p in tree.workers))
        if reexec is not None:
            worker_argv = [*reexec, "--workers", "1", "--reuse-port", "--port", str(port)]
            if metrics_port is not None:
                worker_argv += ["--metrics-port", str(metrics_port)]
            _exec_small_supervisor(tree, sockets=sockets, worker_argv=worker_argv, remove_at_exit=remove_at_exit)
        return tree.watch()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for sock in sockets:
            sock.close()


class _Tree:
    """The workers of one supervisor, and what it does when one exits or a signal comes."""

    def __init__(self, *, start: Callable[[], _Worker], on_exit: Callable[[int], None]) -> None:
        self.start = start
        self.on_exit = on_exit
        self.workers: dict[int, _Worker] = {}
        self.stopping: list[int] = []
        self.status = 0

    def add(self, worker: _Worker) -> None:
        self.workers[worker.pid] = worker

    def forward(self, signum: int, _frame: object) -> None:
        if signum != signal.SIGHUP:
            self.stopping.append(signum)
        for worker in self.workers.values():
            _signal(worker.pid, signum)

    def watch(self) -> int:
        """Reap and replace workers until every one has stopped; the exit status."""
        while self.workers:
            pid, raw = _reap()
            if pid == 0:
                time.sleep(_POLL_S)  # a supervisor's idle wait for children; signals interrupt it
                continue
            if pid not in self.workers:
                continue
            worker = self.workers.pop(pid)
            self.on_exit(pid)
            code = os.waitstatus_to_exitcode(raw)
            if self.stopping:
                self.status = self.status or (code if code > 0 else 0)
                continue
            if code > 0 and time.monotonic() - worker.started < FAST_FAILURE_S:
                log.error("uid=- worker %d failed at start (status %d); stopping the others", pid, code)
                self.status = code
                self.stopping.append(signal.SIGTERM)
                for other in self.workers.values():
                    _signal(other.pid, signal.SIGTERM)
                continue
            log.warning("uid=- worker %d exited (status %d); starting another", pid, code)
            self.add(self.start())
        return self.status


def _become_worker(*, parent: int, sockets: Sequence[socket.socket]) -> None:
    """In a forked child: its own process group, default signal handling, stopped with ``parent``,
    without the supervisor's reserving sockets."""
    os.setpgid(0, 0)
    for signum in _FORWARDED:
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
    _stop_with(parent=parent)
    for sock in sockets:
        sock.close()


def _exec_small_supervisor(
    tree: _Tree, *, sockets: Sequence[socket.socket], worker_argv: list[str], remove_at_exit: str | None
) -> None:
    """Replace this process with ``webhook.serving.smallsupervisor``, handing over the workers, the
    reserved sockets and any stop already asked for. The forwarded signals stay blocked across
    the exec (the mask is inherited) until the new image handles them, so none is lost between."""
    fds = [sock.detach() for sock in sockets]
    for fd in fds:
        os.set_inheritable(fd, True)
    root = logging.getLogger()
    state = {
        "workers": [[w.pid, w.started] for w in tree.workers.values()],
        "fds": fds,
        "stopping": tree.stopping,
        "argv": worker_argv,
        "remove_at_exit": remove_at_exit,
        "metrics_dir": os.environ.get(MULTIPROC_ENV, ""),
        "log_format": "json" if any(type(h.formatter).__name__ == "JsonFormatter" for h in root.handlers) else "text",
    }
    signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED)
    sys.stdout.flush()
    sys.stderr.flush()
    script = str(pathlib.Path(__file__).with_name("smallsupervisor.py"))
    # -I -S: the standard library only (no site-packages, no environment), the smallest heap.
    os.execv(sys.executable, [sys.executable, "-I", "-S", script, json.dumps(state)])


MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's multi-process directory variable


def _reserve(host: str, port: int) -> socket.socket:
    try:
        return reserve_port(host, port)
    except OSError as error:
        from webhook.cmdline import errors  # noqa: PLC0415 - only needed on this failure path

        raise errors.InputError(f"cannot listen on {host}:{port}: {error.strerror or error}") from error


def _run_worker(serve_one: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    from webhook.cmdline import errors  # noqa: PLC0415 - the worker reports like the CLI does

    try:
        return serve_one(args)
    except errors.InputError as error:
        print(f"gpu-admission: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _stop_with(*, parent: int) -> None:
    """Have the kernel send this worker SIGTERM when the supervisor dies, however it dies (a
    SIGKILL included): a worker must not outlive it and keep the port. Linux only (prctl);
    elsewhere workers outlive a killed supervisor, as any forked server's would."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the supervisor died before the request was in place
        os.kill(os.getpid(), signal.SIGTERM)


def _reap() -> tuple[int, int]:
    try:
        return os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return 0, 0
    except InterruptedError:
        return 0, 0


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
