"""A real node for the local cluster: containerd (CRI, runc, CNI bridge), a kubelet and kube-proxy on
this machine, joined to the local control plane beside the KWOK nodes. Needs root.

What it is made of, and why (each tried on this kind of machine; the issue lists them):
- containerd from Debian (1.6.x) with its CRI plugin, runc as the runtime (crun refuses hybrid
  cgroups here), ``restrict_oom_score_adj = true`` (this VM forbids lowering ``oom_score_adj``, even
  for root, and the pod sandbox asks for -998), and a pause image built here (a static Go binary
  in an image ``FROM scratch``) as ``sandbox_image``, because registry.k8s.io cannot be reached.
  Its own instance: its own socket, root and state under the cluster directory, never Docker's.
- CNI: a bridge conflist for the plugins of Debian's containernetworking-plugins, with host-local
  IPAM whose data stays under the cluster directory.
- kubelet (built from the same k8s.io/kubernetes module as the control plane) with
  ``cgroupDriver: cgroupfs`` and ``failCgroupV1: false``; the node IP is this machine's
  non-loopback address, which ``kubectl logs``/``exec`` need (the apiserver dials the kubelet there).
  Not left open: it serves HTTPS with a certificate from the cluster CA for its node IP, refuses
  anonymous requests, authenticates by client certificate and bearer token (TokenReview), and
  authorizes every request with a SubjectAccessReview. It talks to the apiserver as
  ``system:node:<name>`` (group ``system:nodes``), which the Node authorizer confines to its own
  node. The apiserver calls it with its own client certificate (``kube-apiserver-kubelet-client``),
  bound to ``system:kubelet-api-admin``.
- kube-proxy (iptables mode) as ``system:kube-proxy``, so that ClusterIPs work from this host
  (kube-apiserver reaches the webhook Service, kube-scheduler the extender Service) and from pods.
  ``kube-proxy --cleanup`` removes its rules on the way down.

One real node per machine: iptables rules and the kubelet's cgroups are machine-wide, so a lock
file refuses a second. `stop` tears everything down (pods' containers, shims, mounts, the bridge,
kube-proxy's rules) so nothing is left behind after a test.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from certs import authority
from webhook.certificates import certfiles
from webhook.cluster import controlplane, nodes, pki

NODE_NAME = "real-node-1"
REAL_LABEL = "gpu-admission.io/real-node"
PAUSE_IMAGE = "gpu-admission.local/pause:3.10"
BRIDGE = "gpuadm0"
POD_SUBNET = "10.85.0.0/24"
# Where the CNI plugins are: Debian's containernetworking-plugins, then the upstream release's place.
CNI_BIN_DIRS = (Path("/usr/lib/cni"), Path("/opt/cni/bin"))
# The plugins the conflist below names, and containerd's own loopback for every sandbox.
CNI_PLUGINS = ("bridge", "host-local", "portmap", "loopback")
CNI_PACKAGE = "containernetworking-plugins"
LOCK = Path("/run/gpu-admission-real-node.lock")
NAMESPACE = "k8s.io"  # containerd's namespace for CRI
COMPONENTS = ("containerd", "kubelet", "kube-proxy")
REQUIRED_BINARIES = ("kubelet", "kube-proxy", "pause")
# Each command the real node runs on the host, and the Debian package that provides it.
HOST_PACKAGES = {"containerd": "containerd", "ctr": "containerd", "runc": "runc", "iptables": "iptables", "docker": "docker.io"}
HOST_TOOLS = tuple(HOST_PACKAGES)


class RealNodeError(controlplane.ClusterError):
    """The real node cannot be started here; the message says what is missing."""


def node_ip() -> str:
    """This machine's address toward the outside (the source of a route to a public address), not loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: connect on UDP only picks the route
        address: str = probe.getsockname()[0]
    if address.startswith("127."):
        raise RealNodeError("no non-loopback IPv4 address: the real node needs one for kubectl logs/exec")
    return address


def cni_bin_dir(candidates: Sequence[Path]) -> Path | None:
    """The first of `candidates` that holds every CNI plugin the node uses, or None."""
    return next((d for d in candidates if all((d / plugin).is_file() for plugin in CNI_PLUGINS)), None)


def missing_host_tools(*, which: Callable[[str], str | None], cni_dirs: Sequence[Path]) -> list[str]:
    """What the real node needs from this machine and does not find, in `HOST_TOOLS` order, then
    `CNI_PACKAGE` when no directory of `cni_dirs` holds every plugin. `which` is `shutil.which`
    outside tests."""
    missing = [tool for tool in HOST_TOOLS if which(tool) is None]
    if cni_bin_dir(cni_dirs) is None:
        missing.append(CNI_PACKAGE)
    return missing


def missing_tools_message(missing: Sequence[str], *, cni_dirs: Sequence[Path]) -> str:
    """One line for `missing_host_tools`'s answer: what is missing and the command that installs it."""
    cni = f"the CNI plugins ({', '.join(CNI_PLUGINS)} in {' or '.join(map(str, cni_dirs))})"
    named = [cni if tool == CNI_PACKAGE else tool for tool in missing]
    packages = sorted({HOST_PACKAGES.get(tool, tool) for tool in missing})
    return f"the real node needs what this machine lacks: {', '.join(named)}; install with `apt-get install {' '.join(packages)}`"


def check_tools() -> None:
    """Root and the host tools the real node runs (before anything is built or started)."""
    if os.geteuid() != 0:
        raise RealNodeError("a real node needs root (containerd, kubelet and kube-proxy run as root)")
    missing = missing_host_tools(which=shutil.which, cni_dirs=CNI_BIN_DIRS)
    if missing:
        raise RealNodeError(missing_tools_message(missing, cni_dirs=CNI_BIN_DIRS))


def check_host(bin_dir: Path) -> None:
    """Everything the real node needs is here: root, the host tools, the built binaries."""
    check_tools()
    absent = [name for name in REQUIRED_BINARIES if not (bin_dir / name).exists()]
    if absent:
        raise RealNodeError(f"{bin_dir} lacks {', '.join(absent)}: run `gpu-admission cluster build --real-node`")


def apiserver_flags(state: controlplane.State, *, address: str) -> list[str]:
    """What kube-apiserver needs beside a real node: reachable from pods on `address` (so that the
    `kubernetes` Service has an endpoint), the Node authorizer, and a client pair for kubelets."""
    keys = state.directory / "pki"
    return [
        "--bind-address=0.0.0.0",
        f"--advertise-address={address}",
        "--endpoint-reconciler-type=lease",
        "--authorization-mode=Node",  # a string list: appended to the base RBAC, so RBAC,Node
        f"--kubelet-client-certificate={keys / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={keys / 'apiserver-kubelet-client.key'}",
        f"--kubelet-certificate-authority={keys / 'ca.crt'}",
        "--kubelet-preferred-address-types=InternalIP",
    ]


def prepare(state: controlplane.State) -> dict[str, list[str]]:
    """Before kube-apiserver starts: the real node's certificates and the apiserver's extra flags."""
    address = node_ip()
    state.node_ip = address
    write_pki(state, address=address)
    return {"kube-apiserver": apiserver_flags(state, address=address)}


def write_pki(state: controlplane.State, *, address: str) -> None:
    """The real node's certificates from the cluster CA: the kubelet's serving pair (node IP and
    name), its client pair as system:node:<name>, kube-proxy's, and the apiserver's kubelet client."""
    keys = state.directory / "pki"
    ca = authority.load_ca(certificate_pem=(keys / "ca.crt").read_bytes(), key_pem=(keys / "ca.key").read_bytes())
    now = datetime.datetime.now(datetime.UTC)
    pairs = {
        "kubelet-serving": authority.issue_serving(ca, hosts=(address, NODE_NAME), now=now),
        "kubelet-client": authority.issue_client(
            ca, common_name=f"system:node:{NODE_NAME}", organizations=("system:nodes",), now=now
        ),
        "kube-proxy": authority.issue_client(ca, common_name="system:kube-proxy", now=now),
        "apiserver-kubelet-client": authority.issue_client(ca, common_name="kube-apiserver-kubelet-client", now=now),
    }
    for name, pair in pairs.items():
        certfiles.write_atomically(keys / f"{name}.crt", pair.certificate_pem, mode=0o644)
        certfiles.write_atomically(keys / f"{name}.key", pair.key_pem, mode=certfiles.SECRET_MODE)
    # The apiserver's own serving certificate must also name the address pods and the kubelet use.
    serving = authority.issue_serving(ca, hosts=(*pki.APISERVER_HOSTS, address), now=now)
    certfiles.write_atomically(keys / "apiserver.crt", serving.certificate_pem, mode=0o644)
    certfiles.write_atomically(keys / "apiserver.key", serving.key_pem, mode=certfiles.SECRET_MODE)


def node_dir(state: controlplane.State) -> Path:
    return state.directory / "node"


def socket_path(state: controlplane.State) -> Path:
    return node_dir(state) / "containerd.sock"


def write_configs(state: controlplane.State, *, address: str, cni_bin: Path) -> None:
    """containerd's configuration (its CNI plugins in `cni_bin`), the CNI conflist, the kubelet's
    configuration and the kubeconfigs."""
    base = node_dir(state)
    for sub in ("containerd-root", "containerd-state", "kubelet", "net.d", "cni-data"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    (base / "containerd.toml").write_text(
        "\n".join(
            [
                "version = 2",
                f'root = "{base / "containerd-root"}"',
                f'state = "{base / "containerd-state"}"',
                "[grpc]",
                f'  address = "{socket_path(state)}"',
                '[plugins."io.containerd.grpc.v1.cri"]',
                f'  sandbox_image = "{PAUSE_IMAGE}"',
                "  restrict_oom_score_adj = true",
                "  enable_selinux = false",
                '  [plugins."io.containerd.grpc.v1.cri".containerd]',
                '    snapshotter = "overlayfs"',
                '    default_runtime_name = "runc"',
                '    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]',
                '      runtime_type = "io.containerd.runc.v2"',
                '  [plugins."io.containerd.grpc.v1.cri".cni]',
                f'    bin_dir = "{cni_bin}"',
                f'    conf_dir = "{base / "net.d"}"',
                "",
            ]
        )
    )
    conflist = {
        "cniVersion": "1.0.0",
        "name": "gpu-admission",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(base / "cni-data"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    (base / "net.d" / "10-gpu-admission.conflist").write_text(json.dumps(conflist, indent=2))
    keys = state.directory / "pki"
    ports = state.ports
    kubelet_config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "address": address,
        "port": ports["kubelet"],
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports["kubelet-healthz"],
        "readOnlyPort": 0,
        "tlsCertFile": str(keys / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(keys / "kubelet-serving.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(keys / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{socket_path(state)}",
        "resolvConf": "/etc/resolv.conf",
        "registerNode": True,
        "serializeImagePulls": False,
        # This machine's disk is shared: evict only when it is really full.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "2%", "imagefs.available": "2%"},
        "imageGCHighThresholdPercent": 99,
        "imageGCLowThresholdPercent": 98,
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
        "podPidsLimit": 4096,
        "maxPods": 30,
        "localStorageCapacityIsolation": True,
    }
    (base / "kubelet.yaml").write_text(json.dumps(kubelet_config, indent=2))
    for name, user in (("kubelet", "kubelet-client"), ("kube-proxy", "kube-proxy")):
        _write_kubeconfig(
            base / f"{name}.kubeconfig",
            server=state.server,
            ca=keys / "ca.crt",
            cert=keys / f"{user}.crt",
            key=keys / f"{user}.key",
        )
    proxy_config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(base / "kube-proxy.kubeconfig")},
        "hostnameOverride": NODE_NAME,
        "bindAddress": address,
        "clusterCIDR": POD_SUBNET,
        "healthzBindAddress": f"127.0.0.1:{ports['kube-proxy-healthz']}",
        "metricsBindAddress": f"127.0.0.1:{ports['kube-proxy-metrics']}",
        # This VM does not let kube-proxy raise the conntrack table: leave the kernel's settings.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "iptables": {"masqueradeAll": False, "syncPeriod": "5s", "minSyncPeriod": "0s"},
    }
    (base / "kube-proxy.yaml").write_text(json.dumps(proxy_config, indent=2))


def _write_kubeconfig(path: Path, *, server: str, ca: Path, cert: Path, key: Path) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "user", "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "user"}}],
        "current-context": "local",
    }
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)


def bind_kubelet_api(state: controlplane.State) -> None:
    """Let the apiserver's kubelet client (logs, exec, port-forward) use the kubelet's API."""
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "gpu-admission-local:apiserver-kubelet-client"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:kubelet-api-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kube-apiserver-kubelet-client"}],
    }
    controlplane.kubectl(state, "apply", "-f", "-", stdin=json.dumps(binding))


def claim(state: controlplane.State) -> None:
    """Take the machine-wide lock for the real node (held by the cluster directory until `stop`)."""
    owner_file = LOCK
    with contextlib.suppress(FileNotFoundError):
        owner = owner_file.read_text().strip()
        if owner and owner != str(state.directory) and Path(owner, controlplane.STATE_FILE).exists():
            other = controlplane.State.load(Path(owner))
            if other is not None and any(other.running().get(name, False) for name in COMPONENTS):
                raise RealNodeError(f"a real node already runs on this machine (cluster {owner}); one at a time")
    owner_file.write_text(str(state.directory))


def load_image(state: controlplane.State, archive: Path) -> None:
    """Import a `docker save` archive into the node's containerd (CRI's namespace)."""
    completed = subprocess.run(
        ["ctr", "--address", str(socket_path(state)), "-n", NAMESPACE, "images", "import", "--no-unpack", str(archive)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if completed.returncode != 0:
        raise RealNodeError(f"ctr images import {archive.name}: {completed.stderr.strip() or completed.stdout.strip()}")


def docker_image_archive(state: controlplane.State, image: str) -> Path:
    """`docker save` of a local image into the node directory."""
    archive = node_dir(state) / (image.replace("/", "_").replace(":", "_") + ".tar")
    completed = subprocess.run(
        ["docker", "save", "-o", str(archive), image], capture_output=True, text=True, check=False, timeout=300
    )
    if completed.returncode != 0:
        raise RealNodeError(f"docker save {image}: {completed.stderr.strip()}")
    return archive


def build_pause_image(state: controlplane.State) -> None:
    """The sandbox image, FROM scratch with the static pause binary, made with docker once per machine."""
    present = subprocess.run(["docker", "image", "inspect", PAUSE_IMAGE], capture_output=True, check=False)
    if present.returncode != 0:
        context = node_dir(state) / "pause-image"
        context.mkdir(parents=True, exist_ok=True)
        shutil.copy2(state.bin_dir / "pause", context / "pause")
        (context / "Dockerfile").write_text('FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n')
        completed = subprocess.run(
            ["docker", "build", "-q", "-t", PAUSE_IMAGE, str(context)], capture_output=True, text=True, check=False, timeout=300
        )
        if completed.returncode != 0:
            raise RealNodeError(f"building the pause image: {completed.stderr.strip()}")
    load_image(state, docker_image_archive(state, PAUSE_IMAGE))


def start(state: controlplane.State, *, address: str, timeout: float = 180.0) -> None:
    """containerd, then the pause image in it, kubelet and kube-proxy; wait until the node is Ready."""
    for name in ("kubelet", "kubelet-healthz", "kube-proxy-healthz", "kube-proxy-metrics"):
        state.ports.setdefault(name, controlplane.free_port())
    cni_bin = cni_bin_dir(CNI_BIN_DIRS)
    if cni_bin is None:
        raise RealNodeError(missing_tools_message([CNI_PACKAGE], cni_dirs=CNI_BIN_DIRS))
    claim(state)
    write_configs(state, address=address, cni_bin=cni_bin)
    base = node_dir(state)
    controlplane.start(state, "containerd", command=["containerd", "--config", str(base / "containerd.toml")])
    controlplane.wait_for(lambda: _ctr_ok(state), what="containerd", timeout=60, state=state, component="containerd")
    build_pause_image(state)
    bind_kubelet_api(state)
    controlplane.start(
        state,
        "kubelet",
        command=[
            str(state.bin_dir / "kubelet"),
            f"--config={base / 'kubelet.yaml'}",
            f"--kubeconfig={base / 'kubelet.kubeconfig'}",
            f"--root-dir={base / 'kubelet'}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={address}",
            f"--node-labels={REAL_LABEL}=true",
            "--v=1",
        ],
    )
    controlplane.start(
        state,
        "kube-proxy",
        command=[str(state.bin_dir / "kube-proxy"), f"--config={base / 'kube-proxy.yaml'}", "--v=1"],
    )
    controlplane.wait_for(
        lambda: _node_ready(state), what=f"the real node {NODE_NAME} Ready", timeout=timeout, state=state, component="kubelet"
    )


def stop(state: controlplane.State) -> list[str]:
    """Tear the real node down without leaving processes, containers, network namespaces, mounts,
    iptables rules or the bridge; the components stopped.

    First the kubelet itself stops every pod (a NoExecute taint evicts them and keeps DaemonSets
    off, so each sandbox is torn down through CNI as usual); what is left after `drain_s` is killed
    through containerd, and CNI DEL is run for its sandboxes here.
    """
    base = node_dir(state)
    running = state.running()
    stopped = [name for name in COMPONENTS if running.get(name)]
    if running.get("kubelet") and running.get("kube-apiserver"):
        _drain(state)
    controlplane.stop(state, [n for n in ("kube-proxy", "kubelet") if n in state.pids], grace=15.0)
    if state.running().get("containerd"):
        _remove_containers(state)
    controlplane.stop(state, [n for n in ("containerd",) if n in state.pids], grace=15.0)
    _kill_shims(state)
    _unmount_under(base)
    if (state.bin_dir / "kube-proxy").exists():
        subprocess.run([str(state.bin_dir / "kube-proxy"), "--cleanup"], capture_output=True, check=False, timeout=60)
    _remove_kubelet_chains()
    subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False, timeout=30)
    with contextlib.suppress(FileNotFoundError, OSError):
        if LOCK.read_text().strip() == str(state.directory):
            LOCK.unlink()
    return stopped


DRAIN_TAINT = "gpu-admission.io/tear-down"


def _drain(state: controlplane.State, *, drain_s: float = 60.0) -> None:
    """Evict every pod from the node through the kubelet (graceful, with CNI DEL), within `drain_s`."""
    tainted = controlplane.kubectl(state, "taint", "node", NODE_NAME, f"{DRAIN_TAINT}=true:NoExecute", "--overwrite", check=False)
    if tainted.returncode != 0:
        return

    def empty() -> bool:
        listed = controlplane.kubectl(
            state, "get", "pods", "--all-namespaces", "--field-selector", f"spec.nodeName={NODE_NAME}", "-o", "name", check=False
        )
        return listed.returncode == 0 and not listed.stdout.strip() and not _running_tasks(state)

    with contextlib.suppress(controlplane.ClusterError):
        controlplane.wait_for(empty, what="the real node drained", timeout=drain_s)


def teardown_directory(directory: Path) -> list[str]:
    """`stop` for a cluster directory, when its state says a real node ran there."""
    state = controlplane.State.load(directory.resolve())
    if state is not None and (any(name in state.pids for name in COMPONENTS) or node_dir(state).exists()):
        return stop(state)
    return []


def _ctr(state: controlplane.State, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ctr", "--address", str(socket_path(state)), "-n", NAMESPACE, *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


def _ctr_ok(state: controlplane.State) -> bool:
    return _ctr(state, "version", timeout=10).returncode == 0


def _running_tasks(state: controlplane.State) -> list[str]:
    """Tasks still running (a stopped sandbox stays listed until the kubelet's GC, already torn down)."""
    return [line.split()[0] for line in _ctr(state, "tasks", "ls").stdout.splitlines()[1:] if "RUNNING" in line]


def _sandboxes(state: controlplane.State) -> dict[str, str]:
    """The pod sandboxes in the node's containerd: container id → network namespace path."""
    found: dict[str, str] = {}
    for container in _ctr(state, "containers", "ls", "-q").stdout.split():
        info = _ctr(state, "containers", "info", container)
        if info.returncode != 0:
            continue
        try:
            described = json.loads(info.stdout)
        except ValueError:
            continue
        if (described.get("Labels") or {}).get("io.cri-containerd.kind") != "sandbox":
            continue
        namespaces = ((described.get("Spec") or {}).get("linux") or {}).get("namespaces") or []
        found[container] = next((n.get("path", "") for n in namespaces if n.get("type") == "network"), "")
    return found


def cni_delete_requests(
    conflist: dict[str, object], *, container: str, netns: str, cni_path: str
) -> list[tuple[dict[str, str], bytes]]:
    """CNI DEL for one sandbox, plugin by plugin in reverse order: (environment, stdin) pairs."""
    plugins = conflist.get("plugins")
    requests: list[tuple[dict[str, str], bytes]] = []
    for plugin in reversed(plugins if isinstance(plugins, list) else []):
        config = {"cniVersion": conflist.get("cniVersion"), "name": conflist.get("name"), **plugin}
        environment = {
            "CNI_COMMAND": "DEL",
            "CNI_CONTAINERID": container,
            "CNI_NETNS": netns,
            "CNI_IFNAME": "eth0",
            "CNI_PATH": cni_path,
            "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        }
        requests.append((environment, json.dumps(config).encode()))
    return requests


def _cni_delete(state: controlplane.State, container: str, netns: str) -> None:
    conflist_path = node_dir(state) / "net.d" / "10-gpu-admission.conflist"
    try:
        conflist = json.loads(conflist_path.read_text())
    except (OSError, ValueError):
        return
    cni_bin = cni_bin_dir(CNI_BIN_DIRS) or CNI_BIN_DIRS[0]
    for environment, stdin in cni_delete_requests(conflist, container=container, netns=netns, cni_path=str(cni_bin)):
        plugin = json.loads(stdin)["type"]
        subprocess.run([str(Path(cni_bin, plugin))], input=stdin, env=environment, capture_output=True, check=False, timeout=30)
    if netns.startswith(("/var/run/netns/", "/run/netns/")):
        subprocess.run(["umount", netns], capture_output=True, check=False, timeout=30)
        with contextlib.suppress(OSError):
            os.unlink(netns)


def _remove_kubelet_chains() -> None:
    """The kubelet's own iptables chains (kube-proxy --cleanup leaves them): KUBE-FIREWALL and the canaries."""
    for binary in ("iptables", "ip6tables"):
        if shutil.which(binary) is None:
            continue
        for hook in ("INPUT", "OUTPUT"):
            subprocess.run([binary, "-D", hook, "-j", "KUBE-FIREWALL"], capture_output=True, check=False, timeout=30)
        for table in ("filter", "nat", "mangle"):
            for chain in ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"):
                subprocess.run([binary, "-t", table, "-F", chain], capture_output=True, check=False, timeout=30)
                subprocess.run([binary, "-t", table, "-X", chain], capture_output=True, check=False, timeout=30)


def _remove_containers(state: controlplane.State) -> None:
    """Kill every task and delete every container of the node's containerd (pods and sandboxes),
    with CNI DEL for each sandbox so that no network namespace or masquerade rule is left."""
    sandboxes = _sandboxes(state)
    tasks = [line.split()[0] for line in _ctr(state, "tasks", "ls").stdout.splitlines()[1:] if line.strip()]
    for task in tasks:
        _ctr(state, "tasks", "kill", "--signal", "SIGKILL", task)
    deadline = time.monotonic() + 20
    while tasks and time.monotonic() < deadline:
        running = [line for line in _ctr(state, "tasks", "ls").stdout.splitlines()[1:] if "RUNNING" in line]
        if not running:
            break
        time.sleep(0.5)
    for task in tasks:
        _ctr(state, "tasks", "delete", "--force", task)
    for container, netns in sandboxes.items():
        _cni_delete(state, container, netns)
    for container in _ctr(state, "containers", "ls", "-q").stdout.split():
        _ctr(state, "containers", "delete", container)


def _kill_shims(state: controlplane.State) -> None:
    """containerd-shim processes started for this node's containerd (found by its socket in their command line)."""
    address = str(socket_path(state)).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"containerd-shim" in cmdline and address in cmdline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), 9)


def mounts_under(root: Path, mountinfo: str) -> list[str]:
    """Mount points at or below `root`, deepest first (`/proc/self/mountinfo`'s fifth field, unescaped)."""
    prefix = str(root.resolve())
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        point = fields[4].encode().decode("unicode_escape")
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def _unmount_under(root: Path) -> None:
    if not root.exists():
        return
    for _ in range(3):
        points = mounts_under(root, Path("/proc/self/mountinfo").read_text())
        if not points:
            return
        for point in points:
            subprocess.run(["umount", "--lazy", point], capture_output=True, check=False, timeout=30)


def _node_ready(state: controlplane.State) -> bool:
    node = json.loads(controlplane.kubectl(state, "get", "node", NODE_NAME, "-o", "json").stdout)
    conditions = node.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def real_nodes(names_and_annotations: Sequence[tuple[str, dict[str, str]]]) -> list[str]:
    """The names of nodes that KWOK does not manage (real kubelets)."""
    return [name for name, annotations in names_and_annotations if annotations.get(nodes.KWOK_ANNOTATION) != "fake"]
