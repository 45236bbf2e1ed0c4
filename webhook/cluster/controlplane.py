"""The local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok
as background processes under one directory, with their state in `DIR/state.json`."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from webhook.cluster import nodes, pki

logger = logging.getLogger(__name__)

STATE_FILE = "state.json"
START_ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
_CREATED = ("etcd", "pki", "kubeconfig", "scheduler.yaml", STATE_FILE, "webhook", "inventory", "node")


class ClusterError(RuntimeError):
    """The cluster cannot be started or used; the message is one line."""


@dataclasses.dataclass(kw_only=True)
class State:
    """What runs under a directory: process ids, ports and where the binaries are."""

    directory: Path
    bin_dir: Path
    ports: dict[str, int] = dataclasses.field(default_factory=dict)
    pids: dict[str, int] = dataclasses.field(default_factory=dict)
    # Flags appended to a component's command (a later flag wins), e.g. for a real node.
    extra_args: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    node_ip: str = ""  # a real node's address, when the cluster has one

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['kube-apiserver']}"

    def save(self) -> None:
        data = {
            "bin_dir": str(self.bin_dir),
            "ports": self.ports,
            "pids": self.pids,
            "extra_args": self.extra_args,
            "node_ip": self.node_ip,
        }
        tmp = self.directory / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(self.directory / STATE_FILE)

    @classmethod
    def load(cls, directory: Path) -> State | None:
        try:
            data = json.loads((directory / STATE_FILE).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as error:
            raise ClusterError(f"{directory / STATE_FILE}: unreadable state: {error}") from error
        return cls(
            directory=directory,
            bin_dir=Path(data["bin_dir"]),
            ports=data["ports"],
            pids=data["pids"],
            extra_args=data.get("extra_args", {}),
            node_ip=data.get("node_ip", ""),
        )

    def running(self) -> dict[str, bool]:
        return {name: _alive(pid) for name, pid in self.pids.items()}


# Ports are handed out below the kernel's ephemeral range: a port the kernel picked (bind to 0)
# comes from that range, and between our check and the component's own bind the kernel may give
# it to any outgoing connection on the machine as its local port (seen in CI: kube-controller-
# manager failing with "address already in use" while the suite's other clusters were busy).
_PORT_FLOOR = 10_000
_PORT_TRIES = 200
_handed_out: set[int] = set()
_random = random.SystemRandom()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(part) for part in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def free_port() -> int:
    """A port nobody listens on now, outside the kernel's ephemeral range where there is room
    below it (else one the kernel picks), never the same one twice in a process."""
    low, _ = _ephemeral_range()
    if low - _PORT_FLOOR >= 1_000:
        for _ in range(_PORT_TRIES):
            port = _random.randrange(_PORT_FLOOR, low)
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        picked: int = sock.getsockname()[1]
        return picked


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


# Kubernetes 1.34: MutatingAdmissionPolicy is beta, off by default; its gate and API version are
# opt-in (`cluster up --mutating-admission-policies`), so every other run keeps the default apiserver.
MUTATING_ADMISSION_POLICY_FLAGS = (
    "--feature-gates=MutatingAdmissionPolicy=true",
    "--runtime-config=admissionregistration.k8s.io/v1beta1=true",
)


# Kubernetes 1.34: DeviceTaintRule (resource.k8s.io/v1alpha3) is alpha, behind DRADeviceTaints (on the
# apiserver, and on each kube-scheduler that is to honour device taints: `DRA_DEVICE_TAINT_GATE`).
# Flags only, no extra process: the e2e session cluster starts with them at no cost (docs/dra.md).
DRA_DEVICE_TAINT_GATE = "--feature-gates=DRADeviceTaints=true"
DRA_DEVICE_TAINT_FLAGS = (DRA_DEVICE_TAINT_GATE, "--runtime-config=resource.k8s.io/v1alpha3=true")
DRA_DEVICE_TAINTS_HELP = (
    "turn on DRA device taints (alpha in 1.34: the DRADeviceTaints gate and resource.k8s.io/v1alpha3), so the extender "
    "keeps cards that hold shared pods from DRA with DeviceTaintRules; without it (Kubernetes as shipped) it uses "
    "ResourceClaims of its own (docs/dra.md)"
)


def dra_device_taint_flags(on: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """kube-apiserver's and kube-scheduler's extra flags for DRA device taints on (or none: off)."""
    return (DRA_DEVICE_TAINT_FLAGS, (DRA_DEVICE_TAINT_GATE,)) if on else ((), ())


def up(
    directory: Path,
    *,
    bin_dir: Path,
    fake_nodes: Sequence[nodes.FakeNode],
    before_scheduler: Callable[[State], Mapping[str, Any] | None] | None = None,
    prepare: Callable[[State], Mapping[str, Sequence[str]]] | None = None,
    timeout: float = 120.0,
    apiserver_flags: Sequence[str] = (),
    scheduler_flags: Sequence[str] = (),
) -> State:
    """Start every component, create the fake nodes and wait until all of them are Ready.

    `before_scheduler` runs once the apiserver is ready and before kube-scheduler starts; it may
    start processes the scheduler calls (the extender) and return the scheduler configuration.
    `prepare` runs once the key material is written and before anything starts; it returns flags
    to append per component (the real node's, `realnode.prepare`). `apiserver_flags` are appended to
    kube-apiserver's (opt-in API groups and feature gates: `MUTATING_ADMISSION_POLICY_FLAGS`),
    `scheduler_flags` to kube-scheduler's (`DRA_DEVICE_TAINT_GATE`).
    """
    directory = directory.resolve()
    existing = State.load(directory)
    if existing is not None and any(existing.running().values()):
        raise ClusterError(f"a cluster already runs in {directory}; run `gpu-admission cluster down --dir {directory}` first")
    if existing is not None:
        _remove_state(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "logs").mkdir(exist_ok=True)
    state = State(directory=directory, bin_dir=bin_dir)
    state.ports = {
        name: free_port() for name in ("etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
    }
    pki.write_all(directory / "pki")
    if prepare is not None:
        state.extra_args = {name: list(flags) for name, flags in prepare(state).items()}
    if apiserver_flags:
        state.extra_args.setdefault("kube-apiserver", []).extend(apiserver_flags)
    if scheduler_flags:
        state.extra_args.setdefault("kube-scheduler", []).extend(scheduler_flags)
    _write_kubeconfig(state)
    write_scheduler_config(state)
    deadline = time.monotonic() + timeout
    try:
        for name in START_ORDER:
            if name == "kube-scheduler" and before_scheduler is not None:
                configuration = before_scheduler(state)
                if configuration is not None:
                    write_scheduler_config(state, configuration)
            start(state, name)
            if name == "etcd":
                _wait(
                    lambda: _http_ok(f"http://127.0.0.1:{state.ports['etcd']}/health"),
                    what="etcd",
                    deadline=deadline,
                    state=state,
                    component="etcd",
                )
            if name == "kube-apiserver":
                _wait(
                    lambda: _api_ok(state, "/readyz"),
                    what="kube-apiserver /readyz",
                    deadline=deadline,
                    state=state,
                    component=name,
                )
        kubectl(
            state,
            "apply",
            "-f",
            "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": [n.manifest() for n in fake_nodes]}),
        )
        names = [node.name for node in fake_nodes]
        _wait(
            lambda: _nodes_ready(state, names),
            what=f"{len(names)} fake nodes Ready",
            deadline=deadline,
            state=state,
            component="kwok",
        )
        # kube-controller-manager creates each namespace's `default` ServiceAccount; until it has, the
        # ServiceAccount admission plugin refuses pods there.
        _wait(
            lambda: _has_default_serviceaccount(state),
            what="the default ServiceAccount",
            deadline=deadline,
            state=state,
            component="kube-controller-manager",
        )
    except BaseException:
        stop(state)
        raise
    return state


def start(state: State, name: str, *, command: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Start one component (or any extra process under the cluster, given its command) and record it."""
    argv = list(command) if command is not None else [*_command(state, name), *state.extra_args.get(name, [])]
    log = open(state.directory / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child, closed below
    try:
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # keeps running after `up` returns, and is not hit by the caller's Ctrl-C
            env={**os.environ, **(env or {})},
            cwd=state.directory,
        )
    finally:
        log.close()
    state.pids[name] = process.pid
    state.save()
    return process.pid


def stop(state: State, names: Iterable[str] | None = None, *, grace: float = 10.0) -> None:
    """Stop components (all by default) in reverse start order: TERM, then KILL after `grace`."""
    chosen = list(names) if names is not None else list(state.pids)
    for name in reversed(chosen):
        pid = state.pids.get(name)
        if pid is not None:
            _terminate(pid, grace=grace)
            state.pids.pop(name, None)
    state.save()


def down(directory: Path) -> list[str]:
    """Stop everything under `directory` and remove its state (logs stay). Returns what was stopped."""
    directory = directory.resolve()
    state = State.load(directory)
    if state is None:
        return []
    stopped = [name for name, alive in state.running().items() if alive]
    stop(state)
    _remove_state(directory)
    return stopped


def kubectl(state: State, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the built kubectl against this cluster."""
    completed = subprocess.run(
        [str(state.bin_dir / "kubectl"), f"--kubeconfig={state.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if check and completed.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args)}: {completed.stderr.strip() or completed.stdout.strip()}")
    return completed


def log_tail(state: State, name: str, *, lines: int = 15) -> str:
    try:
        text = (state.directory / "logs" / f"{name}.log").read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def wait_for(
    predicate: Callable[[], bool], *, what: str, timeout: float, state: State | None = None, component: str = ""
) -> None:
    """Poll `predicate` until it holds or `timeout` passes (then a ClusterError naming `what`)."""
    _wait(predicate, what=what, deadline=time.monotonic() + timeout, state=state, component=component)


def _wait(predicate: Callable[[], bool], *, what: str, deadline: float, state: State | None, component: str) -> None:
    delay = 0.1
    while True:
        if state is not None and component and component in state.pids and not _alive(state.pids[component]):
            raise ClusterError(f"{component} exited while waiting for {what}:\n{log_tail(state, component)}")
        with contextlib.suppress(Exception):
            if predicate():
                return
        if time.monotonic() > deadline:
            tail = f":\n{log_tail(state, component)}" if state is not None and component else ""
            raise ClusterError(f"timed out waiting for {what}{tail}")
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)


def _command(state: State, name: str) -> list[str]:
    b, d, p = state.bin_dir, state.directory, state.ports
    pki_dir = d / "pki"
    kubeconfig = str(state.kubeconfig)
    if name == "etcd":
        peer = f"http://127.0.0.1:{p['etcd-peer']}"
        return [
            str(b / "etcd"),
            "--name=local",
            f"--data-dir={d / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{p['etcd']}",
            f"--advertise-client-urls=http://127.0.0.1:{p['etcd']}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=local={peer}",
            "--unsafe-no-fsync=true",  # test data only; fsync dominates etcd latency on small disks
            "--log-level=warn",
        ]
    if name == "kube-apiserver":
        return [
            str(b / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{p['etcd']}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={p['kube-apiserver']}",
            f"--cert-dir={pki_dir}",
            f"--tls-cert-file={pki_dir / 'apiserver.crt'}",
            f"--tls-private-key-file={pki_dir / 'apiserver.key'}",
            f"--client-ca-file={pki_dir / 'ca.crt'}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki_dir / 'sa.pub'}",
            f"--service-account-signing-key-file={pki_dir / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",  # so that GPU002 (not the apiserver) is what refuses privileged GPU pods
            # A loopback advertise address cannot back the `kubernetes` Service endpoints.
            "--endpoint-reconciler-type=none",
        ]
    if name == "kube-controller-manager":
        return [
            str(b / "kube-controller-manager"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={p['kube-controller-manager']}",
            "--leader-elect=false",
            f"--service-account-private-key-file={pki_dir / 'sa.key'}",
            f"--root-ca-file={pki_dir / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki_dir / 'ca.crt'}",
            f"--cluster-signing-key-file={pki_dir / 'ca.key'}",
            "--use-service-account-credentials=false",
        ]
    if name == "kube-scheduler":
        return [
            str(b / "kube-scheduler"),
            f"--config={d / 'scheduler.yaml'}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={p['kube-scheduler']}",
        ]
    if name == "kwok":
        return [
            str(b / "kwok"),
            f"--kubeconfig={kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={nodes.KWOK_ANNOTATION}=fake",
            "--cidr=10.244.0.0/16",
            "--node-ip=10.240.0.1",
            "--node-lease-duration-seconds=40",
            f"--server-address=127.0.0.1:{p['kwok']}",
            f"--config={b / 'kwok-stages.yaml'}",
        ]
    raise ClusterError(f"unknown component {name}")


def _write_kubeconfig(state: State) -> None:
    pki_dir = state.directory / "pki"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": state.server, "certificate-authority": str(pki_dir / "ca.crt")}}],
        "users": [
            {
                "name": "admin",
                "user": {"client-certificate": str(pki_dir / "admin.crt"), "client-key": str(pki_dir / "admin.key")},
            }
        ],
        "contexts": [{"name": "gpu-admission-local", "context": {"cluster": "local", "user": "admin"}}],
        "current-context": "gpu-admission-local",
    }
    descriptor = os.open(state.kubeconfig, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as stream:
        json.dump(config, stream, indent=2)  # JSON is YAML; every kubeconfig reader accepts it


def write_scheduler_config(state: State, configuration: Mapping[str, Any] | None = None) -> None:
    """Write the scheduler's configuration, pointed at this cluster and without leader election."""
    config: dict[str, Any] = dict(
        configuration or {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration"}
    )
    config["clientConnection"] = {**config.get("clientConnection", {}), "kubeconfig": str(state.kubeconfig)}
    config["leaderElection"] = {"leaderElect": False}
    (state.directory / "scheduler.yaml").write_text(json.dumps(config, indent=2))


def _ssl_context(state: State) -> ssl.SSLContext:
    pki_dir = state.directory / "pki"
    context = ssl.create_default_context(cafile=str(pki_dir / "ca.crt"))
    context.load_cert_chain(str(pki_dir / "admin.crt"), str(pki_dir / "admin.key"))
    return context


def _api_ok(state: State, path: str) -> bool:
    with urllib.request.urlopen(state.server + path, context=_ssl_context(state), timeout=5) as response:
        return bool(response.status == 200)


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bool(response.status == 200)


def _api_json(state: State, path: str) -> Any:
    with urllib.request.urlopen(state.server + path, context=_ssl_context(state), timeout=10) as response:
        return json.loads(response.read())


def _nodes_ready(state: State, names: Sequence[str]) -> bool:
    items = _api_json(state, "/api/v1/nodes")["items"]
    ready = {
        item["metadata"]["name"]
        for item in items
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in item.get("status", {}).get("conditions", []))
    }
    return set(names) <= ready


def _has_default_serviceaccount(state: State) -> bool:
    try:
        _api_json(state, "/api/v1/namespaces/default/serviceaccounts/default")
    except urllib.error.HTTPError:
        return False
    return True


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        if waited == pid:
            return False  # our own child that has exited (reaped now)
    except ChildProcessError:
        pass  # not our child: started by an earlier `up`
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[-1].split()[0] == "Z":
            return False
    return True


def _terminate(pid: int, *, grace: float) -> None:
    if not _alive(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    while _alive(pid) and time.monotonic() < deadline + 5:
        time.sleep(0.05)


def _remove_state(directory: Path) -> None:
    for name in _CREATED:
        path = directory / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
