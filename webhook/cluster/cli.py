"""`gpu-admission cluster up|down|status|build`: the local control plane from the command line."""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from webhook.cluster import binaries, controlplane, install, nodes, realnode
from webhook.cmdline import errors

ERRORS = (controlplane.ClusterError, binaries.BinariesError, nodes.NodeFileError)
# No --kubeconfig or --context here: the local cluster is named by its directory, which holds its own
# kubeconfig (DIR/kubeconfig, printed by `up` and `status`), the one to pass as --kubeconfig to the
# commands that read a cluster.
DIR_HELP = "the cluster's directory: its state, logs and kubeconfig"


def _one_line_errors(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn this package's errors into the CLI's one-line error with exit status 2."""

    @functools.wraps(func)
    def wrapper(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except ERRORS as error:
            raise errors.InputError(str(error)) from error

    return wrapper


def add_parser(subparsers: Any) -> None:
    """Register `cluster` and its verbs on the top-level CLI."""
    parser = subparsers.add_parser("cluster", help="a local control plane (etcd, apiserver, scheduler, controller-manager, kwok)")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="{up,down,status,build}")

    up = verbs.add_parser("up", help="start the control plane and fake GPU nodes, then install gpu-admission")
    up.add_argument("--dir", required=True, type=Path, metavar="DIR", help=DIR_HELP)
    up.add_argument("--nodes", default=None, metavar="FILE", help="YAML file of fake nodes (default: the built-in set)")
    up.add_argument("--no-install", action="store_true", help="do not start and register the webhook")
    up.add_argument("--config", type=Path, default=None, metavar="FILE", help="policy settings file for the webhook")
    up.add_argument(
        "--real-node",
        action="store_true",
        help="also join a real kubelet on this machine (containerd, CNI, kube-proxy; needs root and docker.io)",
    )
    up.add_argument(
        "--in-cluster",
        action="store_true",
        help="with --real-node: build the image and install gpu-admission from deploy/ as containers on the real node",
    )
    up.add_argument(
        "--image",
        default=None,
        metavar="IMAGE",
        help="with --in-cluster: a local image built from the Dockerfile, instead of building one",
    )
    up.add_argument(
        "--mutating-admission-policies",
        action="store_true",
        help="enable kube-apiserver's MutatingAdmissionPolicy feature gate and admissionregistration.k8s.io/v1beta1 "
        "(for `policies export-map`)",
    )
    up.add_argument("--dra-device-taints", action="store_true", help=controlplane.DRA_DEVICE_TAINTS_HELP)
    up.set_defaults(func=_up)

    down = verbs.add_parser("down", help="stop every process of the cluster and remove its state")
    down.add_argument("--dir", required=True, type=Path, metavar="DIR", help=DIR_HELP)
    down.set_defaults(func=_down)

    status = verbs.add_parser("status", help="say what runs")
    status.add_argument("--dir", required=True, type=Path, metavar="DIR", help=DIR_HELP)
    status.set_defaults(func=_status)

    build = verbs.add_parser("build", help="build (or, with --force, rebuild) the cached control-plane binaries")
    build.add_argument("--force", action="store_true", help="rebuild even what is cached")
    build.add_argument("--real-node", action="store_true", help="also kubelet, kube-proxy and the pause binary")
    build.set_defaults(func=_build)


@_one_line_errors
def _up(args: argparse.Namespace) -> int:
    fake_nodes = nodes.load(args.nodes)
    if args.real_node:
        realnode.check_tools()  # before building kubelet and kube-proxy, which takes minutes
    bin_dir = binaries.ensure(real_node=args.real_node)
    dra_apiserver, dra_scheduler = controlplane.dra_device_taint_flags(args.dra_device_taints)
    state = install.bring_up(
        args.dir,
        bin_dir=bin_dir,
        fake_nodes=fake_nodes,
        with_install=not args.no_install,
        config=args.config,
        real_node=args.real_node,
        in_cluster=args.in_cluster,
        image=args.image,
        apiserver_flags=(
            *(controlplane.MUTATING_ADMISSION_POLICY_FLAGS if args.mutating_admission_policies else ()),
            *dra_apiserver,
        ),
        scheduler_flags=dra_scheduler,
    )
    real = f", real node {realnode.NODE_NAME} Ready at {state.node_ip}" if args.real_node else ""
    print(f"cluster up: {len(fake_nodes)} fake nodes Ready{real}{'' if args.no_install else ', gpu-admission installed'}")
    print(f"kubeconfig: {state.kubeconfig}")
    print(f"  {bin_dir / 'kubectl'} --kubeconfig {state.kubeconfig} get nodes")
    print(f"tear down:  gpu-admission cluster down --dir {args.dir}")
    return 0


@_one_line_errors
def _down(args: argparse.Namespace) -> int:
    stopped = install.tear_down(args.dir)
    print(f"stopped: {', '.join(stopped)}" if stopped else f"nothing runs in {args.dir}")
    return 0


@_one_line_errors
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
    listed = controlplane.kubectl(state, "get", "nodes", "-o", "json", check=False)
    if listed.returncode == 0:
        items = json.loads(listed.stdout)["items"]
        described = [(i["metadata"]["name"], i["metadata"].get("annotations") or {}) for i in items]
        real = set(realnode.real_nodes(described))
        for name, _ in described:
            print(f"node {name:<19} {'real (kubelet)' if name in real else 'fake (kwok)'}")
    print(f"kubeconfig: {state.kubeconfig}")
    return 0 if running and all(running.values()) else 1


@_one_line_errors
def _build(args: argparse.Namespace) -> int:
    print(binaries.ensure(force=args.force, real_node=args.real_node))
    return 0
