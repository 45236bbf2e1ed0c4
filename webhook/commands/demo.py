"""`gpu-admission demo`: the whole system on this machine, with no other input.

It brings up the local cluster (building the control plane on the first run), installs
gpu-admission from `deploy/`, applies the seed workloads and one attempt at each bypass, and prints
what was admitted, what was refused and why, where each pod landed, and the per-card table. Without
a Go toolchain, or installed from a wheel (no source checkout: the cluster is built from its
`deploy/` and its Go tools module), there is no cluster to build, so it falls back to the offline
dry-run of the same examples and says why in one line. The wheel carries the examples for that
(`setup.py` copies `examples/` into the package).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from policies import gpu
from webhook import config
from webhook.cluster import binaries, controlplane, incluster, install, nodes, realnode
from webhook.cmdline import errors, manifests
from webhook.commands import dryrun

NAMESPACE = "demo"
# The examples as the wheel carries them (setup.py's build_py copies examples/ here); a source
# checkout has no such directory and reads its own examples/.
PACKAGED_EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SOURCE_EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def examples_dir() -> Path:
    """The seed workloads and bypass attempts: the wheel's copy, else the source checkout's."""
    return PACKAGED_EXAMPLES if PACKAGED_EXAMPLES.is_dir() else SOURCE_EXAMPLES


EXAMPLES = examples_dir()
DEFAULT_DIR = Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "gpu-admission" / "demo"


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run everything on a local cluster: seed workloads, bypass attempts, placement",
        description="Bring up a local cluster with fake GPU nodes, install gpu-admission, apply the seed "
        "workloads and one attempt at each bypass, and show what happened.",
    )
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"cluster directory (default: {DEFAULT_DIR})")
    parser.add_argument("--offline", action="store_true", help="skip the cluster: dry-run the examples only")
    parser.add_argument(
        "--real-node",
        action="store_true",
        help="the same story with gpu-admission installed from deploy/ as containers on a real kubelet "
        "(needs root, docker.io, containerd; see `cluster up --real-node --in-cluster`)",
    )
    parser.add_argument("--dra-device-taints", action="store_true", help=controlplane.DRA_DEVICE_TAINTS_HELP)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    reason = "--offline" if args.offline else no_cluster(real_node=args.real_node)
    if reason is not None:
        return _offline(reason)
    try:
        return _on_cluster(args.dir, real_node=args.real_node, dra_device_taints=args.dra_device_taints)
    except (controlplane.ClusterError, binaries.BinariesError, nodes.NodeFileError) as error:
        raise errors.InputError(str(error)) from error


def no_cluster(*, real_node: bool = False) -> str | None:
    """Why no local cluster can be built here (one line), or None when one can."""
    prebuilt = bool(os.environ.get(binaries.ENV_BIN_DIR))
    needed = (
        [install.deploy_dir()]
        + ([] if prebuilt else [binaries.build_script()])
        + ([incluster.image_script()] if real_node else [])
    )
    if not all(path.exists() for path in needed):
        return "not run from a source checkout (the local cluster is built from its deploy/ and Go tools module)"
    if not prebuilt and shutil.which("go") is None:
        return "no Go toolchain to build the local control plane"
    return None


def _offline(reason: str) -> int:
    print(f"demo: {reason}; showing the offline dry-run of the same examples instead.\n")
    outcomes = dryrun.evaluate(manifests.read([str(EXAMPLES)], stdin=sys.stdin), settings=config.load(None))
    print(dryrun.render(outcomes, output="table"))
    expected = all(o.decision.allowed != ("bypasses" in o.document.source) for o in outcomes)
    print("every workload admitted and every bypass refused" if expected else "UNEXPECTED verdicts above")
    return 0 if expected else 1


def _on_cluster(directory: Path, *, real_node: bool = False, dra_device_taints: bool = False) -> int:
    if real_node:
        realnode.check_tools()  # before building kubelet and kube-proxy, which takes minutes
    print("== building the control plane (first run only: a few minutes; later runs start in seconds)")
    bin_dir = binaries.ensure(real_node=real_node)
    if controlplane.State.load(directory.resolve()) is not None:
        install.tear_down(directory)
    print(f"== starting the local cluster in {directory}")
    fake_nodes = nodes.load(None)
    if real_node:
        print("   with a real node: the image is built and gpu-admission installed from deploy/ as containers")
    apiserver_flags, scheduler_flags = controlplane.dra_device_taint_flags(dra_device_taints)
    state = install.bring_up(
        directory,
        bin_dir=bin_dir,
        fake_nodes=fake_nodes,
        real_node=real_node,
        in_cluster=real_node,
        apiserver_flags=apiserver_flags,
        scheduler_flags=scheduler_flags,
    )
    where = "as containers on the real node" if real_node else "as local processes"
    print(
        f"   {len(fake_nodes)} fake nodes Ready; webhook, extender {where}; {sum(n.inventory is not None for n in fake_nodes)} labelers running"
    )
    controlplane.kubectl(state, "create", "namespace", NAMESPACE)
    controlplane.wait_for(
        lambda: controlplane.kubectl(state, "get", "serviceaccount", "default", "-n", NAMESPACE, check=False).returncode == 0,
        what="the demo namespace",
        timeout=30,
    )

    ok = True
    print("\n== applying the seed workloads (should be admitted)")
    for path in sorted((EXAMPLES / "workloads").glob("*.yaml")):
        ok &= _apply(state, path, expect_admitted=True)
    print("\n== applying one attempt at each bypass (should be refused)")
    bypasses = sorted((EXAMPLES / "bypasses").glob("*.yaml"))
    if not bypasses:
        print(f"   FAILED    no bypass examples under {EXAMPLES / 'bypasses'}")
        ok = False
    for path in bypasses:
        ok &= _apply(state, path, expect_admitted=False)

    print("\n== where the pods landed")
    _wait_running(state)
    print(_placement_table(state))
    inspect_table = _inspect(state)
    if inspect_table:
        print("\n== per-card GPU memory (gpu-admission inspect)")
        print(inspect_table)

    kubectl = state.bin_dir / "kubectl"
    print("\n== the cluster keeps running")
    print(f"   export KUBECONFIG={state.kubeconfig}")
    print(f"   {kubectl} get pods -n {NAMESPACE} -o wide")
    print(f"   gpu-admission cluster down --dir {directory}    # tear it down")
    print("\ndemo: " + ("every workload admitted and every bypass refused" if ok else "UNEXPECTED results above"))
    return 0 if ok else 1


WEBHOOKS = Path(__file__).resolve().parents[2] / "deploy" / "webhook-configurations.yaml"


def validating_webhooks(path: Path = WEBHOOKS) -> frozenset[str]:
    """The names of the validating webhooks the demo installs (from `deploy/`): the pods' one, and
    the ConfigMaps' and Secrets' (GPU007), ..."""
    return frozenset(
        str(hook["name"])
        for document in yaml.safe_load_all(path.read_text())
        if document and document.get("kind") == "ValidatingWebhookConfiguration"
        for hook in document.get("webhooks", [])
    )


def refused_by(stderr: str, policy: str, *, webhooks: frozenset[str] | None = None) -> bool:
    """Whether kubectl's ``stderr`` is one of our validating webhooks' denial naming ``policy`` (``GPU001``).

    Anything else that makes ``kubectl apply`` fail (a schema error, a missing namespace, a webhook
    that cannot be reached, another webhook, another policy) is not the refusal the bypass example
    is there to show.
    """
    for name in validating_webhooks() if webhooks is None else webhooks:
        denied = f'admission webhook "{name}" denied the request: '
        if any(denied in line and f"{policy}:" in line.split(denied, 1)[1] for line in stderr.splitlines()):
            return True
    return False


def expected_policy(path: Path) -> str:
    """The policy a bypass example is refused by, from its name: ``gpu003-host-path-devices.yaml`` -> ``GPU003``."""
    return path.name.split("-", 1)[0].upper()


def _apply(state: controlplane.State, path: Path, *, expect_admitted: bool) -> bool:
    items = [document.object for document in manifests.read([str(path)], stdin=sys.stdin)]
    for item in items:
        item.get("metadata", {}).pop("namespace", None)  # everything goes into the demo namespace
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    completed = controlplane.kubectl(state, "apply", "-n", NAMESPACE, "-f", "-", stdin=body, check=False)
    if completed.returncode == 0:
        print(f"   admitted  {path.name}: {completed.stdout.strip()}")
        return expect_admitted
    reason = completed.stderr.strip().splitlines()[-1] if completed.stderr.strip() else "no error message"
    if not expect_admitted and refused_by(completed.stderr, expected_policy(path)):
        print(f"   REFUSED   {path.name}: {_short(reason)}")
        return True
    # Failed, but not as the webhook's denial by the expected policy: an unexpected result.
    print(f"   FAILED    {path.name}: {reason}")
    return False


def _short(message: str) -> str:
    marker = "denied the request: "
    return message.split(marker, 1)[1] if marker in message else message


def _pods(state: controlplane.State) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(controlplane.kubectl(state, "get", "pods", "-n", NAMESPACE, "-o", "json").stdout)[
        "items"
    ]
    return items


def _wait_running(state: controlplane.State) -> None:
    def settled() -> bool:
        pods = _pods(state)
        return bool(pods) and all(p.get("status", {}).get("phase") == "Running" for p in pods)

    try:
        controlplane.wait_for(settled, what="demo pods Running", timeout=60)
    except controlplane.ClusterError:
        print("   (some pods are not Running yet; listing them as they are)")


def _placement_table(state: controlplane.State) -> str:
    node_items = json.loads(controlplane.kubectl(state, "get", "nodes", "-o", "json").stdout)["items"]
    labels = {n["metadata"]["name"]: n["metadata"].get("labels", {}) for n in node_items}
    rows = [("POD", "PHASE", "NODE", "MODE", "CARD MODEL", "CARDS")]
    for pod in sorted(_pods(state), key=lambda p: p["metadata"]["name"]):
        node = pod["spec"].get("nodeName", "")
        node_labels = labels.get(node, {})
        annotations = pod["metadata"].get("annotations", {})
        rows.append(
            (
                pod["metadata"]["name"],
                pod.get("status", {}).get("phase", ""),
                node or "-",
                node_labels.get(gpu.SCHEDULE_LABEL, "-"),
                node_labels.get(gpu.CARD_NAME_LABEL, "-"),
                annotations.get(gpu.GPUSHARE_MEM_IDX_ANNOTATION, "-"),
            )
        )
    return _columns(rows)


def _inspect(state: controlplane.State) -> str:
    command = [install.executable(), "inspect", "--kubeconfig", str(state.kubeconfig)]
    completed = subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)
    return completed.stdout.rstrip() if completed.returncode == 0 else ""


def _columns(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "   " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    )
