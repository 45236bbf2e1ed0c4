"""`gpu-admission labeler`: label this node's GPUs (and optionally advertise capacity), once or forever.

```
gpu-admission labeler --node-name NAME [--kubeconfig K] [--once | --interval 60s] [--advertise]
                      [--inventory FILE] [--take-over] [--health-port N] [--dry-run [-o table|json|yaml]]
                      [--usage-interval 60s] [--proc-root /proc] [--list-pods] [--usage-limits SETTINGS]
```

`--usage-limits` names the settings file (the webhook's, `deploy/policy-config.yaml`): the labeler
reads only its `usageLimits` and acts on pods above their GPU memory request (`limits`: Events in
`observe`, evictions in `evict`); read at start (bad limits stop it) and again when the file
changes (bad limits are logged, the last good ones stay: `limits.LimitsFile`).

`NODE_NAME` in the environment stands in for `--node-name` (the DaemonSet sets it from the downward
API). `--dry-run` reads the cards, prints the labels, annotations and capacity (per mode) it would
write and touches no cluster (with `--list-pods` it reads the node's pods, to name the pods of the
cards' processes and tell which pod UIDs the apiserver knows; it never writes). Its `usage` section lists, per card, each process with its
pod (`namespace`, `name`, `uid`) or the literal `outOfBand: true`. Exit status: 0 done; 1 a `--once` pass failed (apiserver, node,
read error); 2 bad input; 3 there is no NVML on this machine (`--once`/`--dry-run` only: the loop
instead stays up, writes nothing and checks again every interval).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from policies import gpu, settings
from webhook.cmdline import errors, flags
from webhook.kube import errors as kube_errors
from webhook.labeler import attribution, cgroups, health, inventory, labels, limits, nvml, ownership, runner

logger = logging.getLogger(__name__)

EXIT_FAILED = 1
EXIT_INPUT_ERROR = errors.EXIT_INPUT_ERROR
EXIT_NO_NVML = 3
DEFAULT_INTERVAL_S = 60.0
NODE_NAME_ENV = "NODE_NAME"


def add_parser(subparsers: Any) -> None:
    """Register `labeler` on the top-level CLI."""
    parser = subparsers.add_parser(
        "labeler",
        help="label this node's GPUs from NVML (or an inventory file) and optionally advertise capacity",
        description="Write the aliyun.accelerator/* and gpu-admission.io/* GPU labels and annotations on a node.",
    )
    parser.add_argument("--node-name", default=None, metavar="NAME", help=f"the node to label (default: ${NODE_NAME_ENV})")
    flags.add_cluster(parser)
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--once", action="store_true", help="one pass, then exit")
    when.add_argument(
        "--interval",
        type=flags.positive_duration,
        default=DEFAULT_INTERVAL_S,
        metavar="DURATION",
        help="time between passes, e.g. 2s, 60s, 1m (default: 60s)",
    )
    parser.add_argument(
        "--advertise",
        action="store_true",
        help="also set the node's extended-resource capacity for its ack.node.gpu.schedule mode",
    )
    parser.add_argument(
        "--inventory", type=Path, default=None, metavar="FILE", help="read the cards from this YAML file instead of NVML"
    )
    parser.add_argument(
        "--take-over", action="store_true", help="replace aliyun.accelerator/* labels that another component wrote"
    )
    parser.add_argument("--dry-run", action="store_true", help="print what would be written; touch no cluster")
    flags.add_output(parser, ("table", "json", "yaml"))  # the --dry-run output
    parser.add_argument(
        "--usage-interval",
        type=flags.positive_duration,
        default=DEFAULT_INTERVAL_S,
        metavar="DURATION",
        help="the least time between two writes of the usage summary annotation (default: 60s)",
    )
    parser.add_argument(
        "--proc-root",
        type=Path,
        default=cgroups.DEFAULT_PROC_ROOT,
        metavar="PATH",
        help="where the host's /proc is (the GPU processes' cgroups are read there; default: /proc)",
    )
    parser.add_argument(
        "--list-pods",
        action="store_true",
        help="with --dry-run: read this node's pods from the cluster (read-only) to name the GPU processes' pods",
    )
    parser.add_argument(
        "--usage-limits",
        type=Path,
        default=None,
        metavar="SETTINGS",
        help="act on pods above their GPU memory request per the usageLimits of this settings file (Events; evictions in evict mode)",
    )
    parser.add_argument(
        "--health-port", type=int, default=None, metavar="PORT", help="serve /healthz and /readyz on this port (0: any free port)"
    )
    flags.add_logging(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    flags.configure_logging(args)
    source, source_name = _source(args.inventory)
    if args.dry_run:
        node_name = _node_name(args, required=False)
        pods = _dry_run_pods(args.kubeconfig, node_name=node_name, context=args.context) if args.list_pods else None
        return _dry_run(
            source, source_name=source_name, node_name=node_name, output=args.output, pods=pods, proc_root=args.proc_root
        )
    node_name = _node_name(args, required=True)
    if args.health_port is not None and not 0 <= args.health_port <= 65535:
        raise errors.InputError(f"--health-port must be 0-65535, not {args.health_port}")
    # Imported here, not above: the `kubernetes` client is only needed from here on, and
    # `--dry-run` on a GPU host must work with nothing but nvidia-ml-py and PyYAML installed.
    from webhook.labeler import publisher  # noqa: PLC0415

    limit_settings = limits.LimitsFile(args.usage_limits, read=_usage_limits) if args.usage_limits is not None else None
    try:
        nodes = publisher.connect(args.kubeconfig, context=args.context, node_name=node_name)
    except publisher.ConnectError as error:
        raise errors.InputError(str(error)) from error
    enforcer = (
        limits.Enforcer(node=node_name, limit_of=limit_settings.usage_limit, actions=nodes)
        if limit_settings is not None
        else None
    )
    loop = runner.Runner(
        source=source,
        nodes=nodes,
        options=runner.Options(
            node_name=node_name,
            interval_s=args.interval,
            advertise=args.advertise,
            take_over=args.take_over,
            usage_interval_s=args.usage_interval,
            proc_root=args.proc_root,
        ),
        pods=nodes,
        enforcer=enforcer,
    )
    server = health.serve(loop, port=args.health_port) if args.health_port is not None else None
    try:
        if args.once:
            return _exit_status(loop.step())
        stop = threading.Event()
        _stop_on_signals(stop)
        loop.run(stop=stop)
        logger.info("stopped")
        return 0
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()


def preview(
    inv: inventory.Inventory,
    *,
    node_name: str,
    source: str,
    pods: list[attribution.PodRef] | None = None,
    identify: attribution.Identify | None = None,
) -> dict[str, Any]:
    """What `--dry-run` prints: what a first pass would write on a node that carries nothing yet,
    and (`usage`) each card's real use with every process and its pod or `outOfBand: true`."""
    plan = ownership.plan(ownership.Node(name=node_name), desired=labels.compute(inv))
    metadata = (plan.patch or {}).get("metadata", {})
    return {
        "node": node_name,
        "source": source,
        "labels": dict(sorted(metadata.get("labels", {}).items())),
        "annotations": dict(sorted(metadata.get("annotations", {}).items())),
        "capacity": {str(mode): labels.capacity(inv, mode=mode) for mode in gpu.Mode},
        "usage": usage_preview(inv, pods=pods, identify=identify or cgroups.read),
    }


def usage_preview(
    inv: inventory.Inventory, *, pods: list[attribution.PodRef] | None, identify: attribution.Identify
) -> list[dict[str, Any]]:
    """Per card: memory used and total, and each process with its pod, `outOfBand: true`, or
    `unknown: true` where its cgroup could not be read."""
    views = attribution.views(inv, pods=pods, identify=identify)
    shown: list[dict[str, Any]] = []
    for card in inv.cards:
        processes: list[dict[str, Any]] = []
        for view in (v for v in views if v.card == card.index):
            entry: dict[str, Any] = {"pid": view.pid, "usedMiB": view.used_mib}
            if view.identity is None:
                entry["unknown"] = True
            elif view.pod is not None:
                entry["pod"] = {"namespace": view.pod.namespace or None, "name": view.pod.name or None, "uid": view.pod.uid}
            else:
                entry["outOfBand"] = True
            if view.identity is not None and view.identity.container_id:
                entry["containerID"] = view.identity.container_id
            if view.out_of_band and view.identity is not None and view.identity.pod_uid:
                entry["podUID"] = view.identity.pod_uid
            processes.append(entry)
        shown.append({"index": card.index, "usedMiB": card.used_mib, "totalMiB": card.memory_mib, "processes": processes})
    return shown


def main(argv: Sequence[str] | None = None) -> int:
    """Run `labeler` on its own (what `python -m webhook.labeler.cli labeler ...` does)."""
    parser = argparse.ArgumentParser(prog="gpu-admission")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return errors.run(parser.parse_args(argv), prog="gpu-admission")


def _source(path: Path | None) -> tuple[runner.Source, str]:
    if path is None:
        return nvml.read, "nvml"
    try:
        inventory.load(path)  # bad input at start is an error now, not a warning every interval
    except inventory.InventoryError as error:
        raise errors.InputError(str(error)) from error

    def read() -> inventory.Inventory:
        return inventory.load(path)

    return read, f"inventory {path}"


def _usage_limits(path: Path) -> settings.Settings:
    """The `usageLimits` of a settings file; bad input is an error now, naming the key."""
    try:
        document = yaml.safe_load(path.read_text())
        found = settings.usage_limits_of(document)
    except (OSError, yaml.YAMLError, settings.InvalidSettings) as error:
        raise errors.InputError(f"--usage-limits {path}: {error}".splitlines()[0]) from error
    for index, entry in enumerate(found):
        if entry.match.selector is not None:
            raise errors.InputError(
                f"--usage-limits {path}: usageLimits[{index}].namespaceSelector: the labeler reads no namespace labels; "
                "name the namespaces (namespaces: [...])"
            )
    return settings.Settings(usage_limits=found)


def _node_name(args: argparse.Namespace, *, required: bool) -> str:
    name = args.node_name or os.environ.get(NODE_NAME_ENV, "")
    if name:
        return str(name)
    if required:
        raise errors.InputError(f"--node-name (or ${NODE_NAME_ENV}) is required")
    return socket.gethostname()


def _dry_run_pods(kubeconfig: str | None, *, node_name: str, context: str | None = None) -> list[attribution.PodRef]:
    from webhook.labeler import publisher  # noqa: PLC0415 - the kubernetes client only where asked for

    try:
        listed = publisher.connect(kubeconfig, context=context).pods_on(node_name)
    except (publisher.ConnectError, kube_errors.KubeError) as error:
        raise errors.InputError(f"listing the pods of node {node_name}: {error}") from error
    return [attribution.PodRef.from_object(pod) for pod in listed]


def _dry_run(
    source: runner.Source,
    *,
    source_name: str,
    node_name: str,
    output: str,
    pods: list[attribution.PodRef] | None = None,
    proc_root: Path = cgroups.DEFAULT_PROC_ROOT,
) -> int:
    try:
        inv = source()
    except nvml.Unavailable as error:
        print(f"gpu-admission labeler: NVML is not available on this machine ({error}); nothing to label", file=sys.stderr)
        return EXIT_NO_NVML
    except (nvml.ReadError, inventory.InventoryError) as error:
        print(f"gpu-admission labeler: reading the GPUs failed: {error}", file=sys.stderr)
        return EXIT_FAILED
    report = preview(
        inv, node_name=node_name, source=source_name, pods=pods, identify=lambda pid: cgroups.read(pid, proc_root=proc_root)
    )
    if output == "json":
        print(json.dumps(report, indent=2))
    elif output == "yaml":
        print(yaml.safe_dump(report, sort_keys=False), end="")
    else:
        print(_table(report), end="")
    return 0


def _table(report: dict[str, Any]) -> str:
    lines = [f"node {report['node']} ({report['source']})"]
    for section in ("labels", "annotations"):
        lines.append(f"{section}:")
        entries = report[section]
        lines.extend(f"  {key}={value}" for key, value in entries.items())
        if not entries:
            lines.append("  (none)")
    lines.append("capacity by ack.node.gpu.schedule mode:")
    for mode, resources in report["capacity"].items():
        lines.append(f"  {mode}: " + ", ".join(f"{name}={value}" for name, value in resources.items()))
    lines.append("usage:")
    for card in report["usage"]:
        used = "?" if card["usedMiB"] is None else card["usedMiB"]
        lines.append(f"  GPU{card['index']}: {used}/{card['totalMiB']} MiB used, {len(card['processes'])} process(es)")
        for process in card["processes"]:
            pod = process.get("pod")
            if pod is not None:
                owner = f"pod {pod['namespace'] or '?'}/{pod['name'] or '?'} ({pod['uid']})"
            elif process.get("outOfBand"):
                owner = "OUT-OF-BAND" + (f" container {process['containerID'][:12]}" if process.get("containerID") else "")
            else:
                owner = "unknown (cgroup not readable)"
            lines.append(f"    pid {process['pid']}: {'?' if process['usedMiB'] is None else process['usedMiB']} MiB, {owner}")
    return "\n".join(lines) + "\n"


def _exit_status(outcome: runner.Outcome) -> int:
    if outcome in (runner.Outcome.CHANGED, runner.Outcome.UNCHANGED):
        return 0
    if outcome is runner.Outcome.NO_NVML:
        return EXIT_NO_NVML
    return EXIT_FAILED


def _stop_on_signals(stop: threading.Event) -> None:
    if threading.current_thread() is not threading.main_thread():
        return

    def handle(signum: int, _frame: object) -> None:
        logger.info("signal %d: stopping after this pass", signum)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, handle)


if __name__ == "__main__":  # pragma: no cover - convenience for running without the console script
    sys.exit(main())
