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
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import dataclasses
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable

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
) -> int:
    """Run ``args.workers`` copies of ``serve_one`` on one port until they stop; the exit status.

    ``args.metrics_port``, where set, is reserved the same way (every worker serves the merged
    metrics there); ``on_exit`` hears each worker's pid once it is reaped.
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
    stopping: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if signum != signal.SIGHUP:
            stopping.append(signum)
        for worker in workers.values():
            _signal(worker.pid, signum)

    def start() -> _Worker:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the worker: its own process group, default signal handling, then serve
            status = 1
            try:
                os.setpgid(0, 0)
                for signum in _FORWARDED:
                    signal.signal(signum, signal.SIG_DFL)
                _stop_with(parent=supervisor)
                reserved.close()
                if reserved_metrics is not None:
                    reserved_metrics.close()
                status = _run_worker(serve_one, child_args)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)
        return _Worker(pid=pid, started=time.monotonic())

    workers: dict[int, _Worker] = {}
    supervisor = os.getpid()
    previous = {signum: signal.signal(signum, forward) for signum in _FORWARDED}
    status = 0
    try:
        for _ in range(args.workers):
            worker = start()
            workers[worker.pid] = worker
        log.info("uid=- %d workers on port %d: %s", args.workers, port, " ".join(str(p) for p in workers))
        while workers:
            pid, raw = _reap()
            if pid == 0:
                time.sleep(_POLL_S)  # a supervisor's idle wait for children; signals interrupt it
                continue
            if pid not in workers:
                continue
            worker = workers.pop(pid)
            on_exit(pid)
            code = os.waitstatus_to_exitcode(raw)
            if stopping:
                status = status or (code if code > 0 else 0)
                continue
            if code > 0 and time.monotonic() - worker.started < FAST_FAILURE_S:
                log.error("uid=- worker %d failed at start (status %d); stopping the others", pid, code)
                status = code if code > 0 else 1
                stopping.append(signal.SIGTERM)
                for other in workers.values():
                    _signal(other.pid, signal.SIGTERM)
                continue
            log.warning("uid=- worker %d exited (status %d); starting another", pid, code)
            replacement = start()
            workers[replacement.pid] = replacement
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        reserved.close()
        if reserved_metrics is not None:
            reserved_metrics.close()
    return status


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
