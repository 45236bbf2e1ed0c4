"""`gpu-admission cluster up|down|status|build`: the local control plane from the command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from webhook.cluster import binaries, controlplane, install, nodes


def add_parser(subparsers: Any) -> None:
    """Register `cluster` and its verbs on the top-level CLI."""
    parser = subparsers.add_parser("cluster", help="a local control plane (etcd, apiserver, scheduler, controller-manager, kwok)")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="{up,down,status,build}")

    up = verbs.add_parser("up", help="start the control plane and fake GPU nodes, then install gpu-admission")
    up.add_argument("--dir", required=True, type=Path, help="directory for state, kubeconfig and logs")
    up.add_argument("--nodes", default=None, help="YAML file of fake nodes (default: the built-in set)")
    up.add_argument("--no-install", action="store_true", help="do not start and register the webhook")
    up.add_argument("--config", type=Path, default=None, help="policy settings file for the webhook")
    up.set_defaults(func=_up)

    down = verbs.add_parser("down", help="stop every process of the cluster and remove its state")
    down.add_argument("--dir", required=True, type=Path)
    down.set_defaults(func=_down)

    status = verbs.add_parser("status", help="say what runs")
    status.add_argument("--dir", required=True, type=Path)
    status.set_defaults(func=_status)

    build = verbs.add_parser("build", help="build (or, with --force, rebuild) the cached control-plane binaries")
    build.add_argument("--force", action="store_true")
    build.set_defaults(func=_build)


def _up(args: argparse.Namespace) -> int:
    fake_nodes = nodes.load(args.nodes)
    bin_dir = binaries.ensure()
    state = install.bring_up(args.dir, bin_dir=bin_dir, fake_nodes=fake_nodes, with_install=not args.no_install, config=args.config)
    print(f"cluster up: {len(fake_nodes)} fake nodes Ready{'' if args.no_install else ', gpu-admission installed'}")
    print(f"kubeconfig: {state.kubeconfig}")
    print(f"  {bin_dir / 'kubectl'} --kubeconfig {state.kubeconfig} get nodes")
    print(f"tear down:  gpu-admission cluster down --dir {args.dir}")
    return 0


def _down(args: argparse.Namespace) -> int:
    stopped = controlplane.down(args.dir)
    print(f"stopped: {', '.join(stopped)}" if stopped else f"nothing runs in {args.dir}")
    return 0


def _status(args: argparse.Namespace) -> int:
    state = controlplane.State.load(args.dir.resolve())
    if state is None:
        print(f"no cluster in {args.dir}")
        return 1
    running = state.running()
    for name, alive in running.items():
        port = state.ports.get(name)
        where = f" port {port}" if port else ""
        print(f"{name:<24} pid {state.pids[name]:<8} {'running' if alive else 'EXITED'}{where}")
    print(f"kubeconfig: {state.kubeconfig}")
    return 0 if running and all(running.values()) else 1


def _build(args: argparse.Namespace) -> int:
    print(binaries.ensure(force=args.force))
    return 0


ERRORS = (controlplane.ClusterError, binaries.BinariesError, nodes.NodeFileError)
"""Errors the top-level CLI prints as one line with exit code 2."""


if __name__ == "__main__":  # pragma: no cover - convenience for running without the console script
    parser = argparse.ArgumentParser(prog="gpu-admission")
    add_parser(parser.add_subparsers(dest="command", required=True))
    parsed = parser.parse_args()
    sys.exit(parsed.func(parsed))
