"""Certificate rotation and replica loss under a continuous stream of pod creates: zero failed requests.

Every test here runs on its own throwaway control plane (one module-scoped cluster), not on the
session cluster: rotating the CA, killing replicas and re-registering the webhook configurations
would otherwise race the other e2e tests, which rely on the session webhook being there (its
registrations fail closed).

The stream is server-side dry-run pod creates (nothing is stored) from a few threads, each answer
checked for the mutation (so a request that skipped the webhook would count as a failure too).
Locally the webhook runs as processes on 127.0.0.1 and the registrations use a URL (no Service, no
kube-proxy); two replicas share one port with SO_REUSEPORT, so that the apiserver's one URL reaches
both and the kernel stops handing connections to a replica once it closes its listener (what
endpoint removal does in a cluster).

The whole webhook down is covered where the local cluster is made, in
`tests/e2e/test_admission.py::test_with_the_webhook_down_pod_creates_fail_closed_but_kube_system_still_works`.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml
from cryptography import x509

from certs import rotation
from tests.e2e.harness import bare_control_plane, eventually
from webhook.cluster import controlplane, install

pytestmark = pytest.mark.e2e

NAMESPACE = "gpu-admission"
CONFIGURATION = "gpu-admission"


@pytest.fixture(scope="module")
def cluster(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[controlplane.State]:
    """A throwaway control plane with one fake node and the webhook's namespace, nothing installed."""
    with bare_control_plane(tmp_path_factory.mktemp("lifecycle"), bin_dir=bin_dir, fake_nodes=1) as state:
        controlplane.kubectl(state, "create", "namespace", NAMESPACE)
        yield state


# --- helpers --------------------------------------------------------------------------------------


class Stream:
    """Server-side dry-run pod creates from ``workers`` threads until the block ends."""

    def __init__(self, state: controlplane.State, *, workers: int = 3) -> None:
        pki = state.directory / "pki"
        self._url = f"{state.server}/api/v1/namespaces/default/pods?dryRun=All"
        self._pool = urllib3.PoolManager(
            maxsize=workers,
            cert_reqs="CERT_REQUIRED",
            ca_certs=str(pki / "ca.crt"),
            cert_file=str(pki / "admin.crt"),
            key_file=str(pki / "admin.key"),
        )
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "stream"},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        }
        self._body = json.dumps(pod).encode()
        self.ok = 0
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._work, daemon=True) for _ in range(workers)]

    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                answer = self._pool.request(
                    "POST", self._url, body=self._body, headers={"Content-Type": "application/json"}, timeout=30.0, retries=False
                )
                status, data = answer.status, answer.data
            except urllib3.exceptions.HTTPError as error:
                status, data = 0, repr(error).encode()
            # 201 with the mutation in it: the webhook saw the pod (GPU104 sets the env var).
            passed = status == 201 and b'"NVIDIA_VISIBLE_DEVICES"' in data
            with self._lock:
                if passed:
                    self.ok += 1
                else:
                    self.failures.append(f"HTTP {status}: {data[:400].decode(errors='replace')}")

    def __enter__(self) -> Stream:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)
        self._pool.clear()
        print(f"stream: {self.ok} creates admitted, {len(self.failures)} failed")  # the evidence, with -rP

    def more(self, count: int, *, timeout: float = 60) -> None:
        """Wait until ``count`` more creates have succeeded."""
        target = self.ok + count
        eventually(lambda: self.ok >= target or bool(self.failures), what=f"{count} more creates", timeout=timeout)


def certs_generate(directory: Path) -> None:
    subprocess.run(
        [install.executable(), "certs", "generate", "--out-dir", str(directory), "--host", "127.0.0.1"],
        check=True,
        capture_output=True,
        text=True,
    )


def start(state: controlplane.State, *args: str) -> str:
    """Start one `gpu-admission serve` under the cluster (stopped by `down` at the latest); its name."""
    name = f"webhook-{uuid.uuid4().hex[:6]}"
    controlplane.start(state, name, command=[install.executable(), "serve", "--host", "127.0.0.1", *args])
    log = state.directory / "logs" / f"{name}.log"
    controlplane.wait_for(
        lambda: "listening on https://" in log.read_text(), what=f"{name} listening", timeout=60, state=state, component=name
    )
    return name


def log_of(state: controlplane.State, name: str) -> str:
    return (state.directory / "logs" / f"{name}.log").read_text(errors="replace")


def register(state: controlplane.State, *, port: int, ca_bundle: bytes) -> None:
    """The webhook configurations of deploy/, pointed at 127.0.0.1:port."""
    documents = [d for d in yaml.safe_load_all((install.deploy_dir() / install.WEBHOOK_CONFIGURATIONS).read_text()) if d]
    items = install.local_registrations(documents, base_url=f"https://127.0.0.1:{port}", ca_bundle=ca_bundle)
    controlplane.kubectl(state, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))


def admitted(state: controlplane.State) -> bool:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }
    done = controlplane.kubectl(state, "create", "--dry-run=server", "-o", "json", "-f", "-", stdin=json.dumps(pod), check=False)
    return done.returncode == 0 and "NVIDIA_VISIBLE_DEVICES" in done.stdout


def served(port: int, *, ca_bundle: bytes) -> x509.Certificate:
    """The certificate the webhook serves now, verified against ``ca_bundle``."""
    context = ssl.create_default_context(cadata=ca_bundle.decode())
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def bundles(state: controlplane.State) -> list[bytes]:
    found = []
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        document = json.loads(controlplane.kubectl(state, "get", kind, CONFIGURATION, "-o", "json").stdout)
        found += [base64.b64decode(hook["clientConfig"].get("caBundle", "")) for hook in document["webhooks"]]
    return found


def metric(port: int, name: str, *, ca_bundle: bytes) -> dict[str, float]:
    context = ssl.create_default_context(cadata=ca_bundle.decode())
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=context, timeout=5) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) :].rsplit(" ", 1)
            values[labels] = float(value)
    return values


def terminate(state: controlplane.State, name: str, *, timeout: float) -> int:
    """SIGTERM one replica and wait for it to exit; its exit status."""
    pid = state.pids[name]
    started = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    deadline = started + timeout
    while time.monotonic() < deadline:
        waited, status = os.waitpid(pid, os.WNOHANG)
        if waited == pid:
            state.pids.pop(name)
            state.save()
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    raise AssertionError(f"{name} did not exit within {timeout}s of SIGTERM:\n{controlplane.log_tail(state, name)}")


def stop_all(state: controlplane.State, names: Sequence[str]) -> None:
    controlplane.stop(state, [n for n in names if n in state.pids], grace=5)


# --- files mode: rotation by rewriting the files --------------------------------------------------


def test_rewriting_the_files_with_the_same_ca_rotates_the_served_certificate_without_a_failed_request(
    cluster: controlplane.State, tmp_path: Path
) -> None:
    certs = tmp_path / "certs"
    certs_generate(certs)
    port = controlplane.free_port()
    name = start(
        cluster,
        "--port",
        str(port),
        "--tls-cert-file",
        str(certs / "tls.crt"),
        "--tls-private-key-file",
        str(certs / "tls.key"),
        "--cert-check-interval",
        "0.2s",
    )
    try:
        ca_bundle = (certs / "ca.crt").read_bytes()
        register(cluster, port=port, ca_bundle=ca_bundle)
        eventually(lambda: admitted(cluster), what="the webhook called by the apiserver")
        before = served(port, ca_bundle=ca_bundle)
        with Stream(cluster) as stream:
            stream.more(30)
            certs_generate(certs)  # same CA (kept in the directory), new serving pair
            eventually(
                lambda: served(port, ca_bundle=ca_bundle).serial_number != before.serial_number, what="the new certificate served"
            )
            after_rotation = stream.ok
            stream.more(30)
        assert stream.failures == [], (
            f"{len(stream.failures)} failed of {stream.ok + len(stream.failures)}: {stream.failures[:3]}"
        )
        assert stream.ok >= after_rotation + 30
        now_served = served(port, ca_bundle=ca_bundle)
        assert now_served == x509.load_pem_x509_certificate((certs / "tls.crt").read_bytes())
        expiry = metric(port, "gpu_admission_certificate_expiry_timestamp_seconds", ca_bundle=ca_bundle)
        assert expiry == {'{certificate="serving"}': now_served.not_valid_after_utc.timestamp()}
        assert "certificate files changed: reloaded" in log_of(cluster, name)
    finally:
        stop_all(cluster, [name])


def test_a_ca_rotation_keeps_both_cas_trusted_and_fails_no_request(cluster: controlplane.State, tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    certs_generate(certs)
    old_ca = x509.load_pem_x509_certificate((certs / "ca.crt").read_bytes())
    port = controlplane.free_port()
    name = start(
        cluster,
        "--port",
        str(port),
        "--tls-cert-file",
        str(certs / "tls.crt"),
        "--tls-private-key-file",
        str(certs / "tls.key"),
        "--cert-check-interval",
        "0.2s",
    )
    try:
        register(cluster, port=port, ca_bundle=(certs / "ca.crt").read_bytes())
        eventually(lambda: admitted(cluster), what="the webhook called by the apiserver")
        with Stream(cluster) as stream:
            stream.more(30)
            rotated = subprocess.run(
                [
                    install.executable(),
                    "certs",
                    "rotate",
                    "--ca",
                    "--out-dir",
                    str(certs),
                    "--kubeconfig",
                    str(cluster.kubeconfig),
                    "--webhook-configuration",
                    CONFIGURATION,
                    "--propagation-delay",
                    "2s",
                ],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert rotated.returncode == 0, rotated.stdout + rotated.stderr
            material = rotation.parse({key: (certs / key).read_bytes() for key in rotation.KEYS})
            assert material.ca is not None and material.serving is not None
            new_ca = material.ca.certificate
            eventually(
                lambda: rotation.signed_by(served(port, ca_bundle=material.bundle_pem()), new_ca),
                what="the leaf from the new CA served",
            )
            stream.more(30)
        assert stream.failures == [], (
            f"{len(stream.failures)} failed of {stream.ok + len(stream.failures)}: {stream.failures[:3]}"
        )
        assert new_ca != old_ca
        assert material.trusted == (new_ca, old_ca), "ca.crt holds the new CA first and keeps the old one"
        for bundle in bundles(cluster):
            assert rotation.parse_bundle(bundle) == (new_ca, old_ca)
        assert "CA rotation requested" in rotated.stdout and "every client trusts the new CA" in rotated.stdout
    finally:
        stop_all(cluster, [name])


# --- HA: one replica of two stopped mid-stream ----------------------------------------------------


def test_sigterm_to_one_of_two_replicas_fails_no_request(cluster: controlplane.State, tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    certs_generate(certs)
    port = controlplane.free_port()
    common = [
        "--port",
        str(port),
        "--reuse-port",
        "--tls-cert-file",
        str(certs / "tls.crt"),
        "--tls-private-key-file",
        str(certs / "tls.key"),
        # The listener closes at once (the kernel then sends new connections to the other
        # replica, as endpoint removal would); kept-alive connections get up to 95 s.
        "--drain-seconds",
        "0",
        "--drain-idle-seconds",
        "95",
    ]
    first, second = start(cluster, *common), start(cluster, *common)
    try:
        register(cluster, port=port, ca_bundle=(certs / "ca.crt").read_bytes())
        eventually(lambda: admitted(cluster), what="the webhook called by the apiserver")
        with Stream(cluster, workers=4) as stream:
            stream.more(150)
            # The kernel spreads the apiserver's few kept-alive connections over the two listeners;
            # stop a replica that holds some (it has served), which is the case that can lose requests.
            served = [name for name in (first, second) if "endpoint=mutate" in log_of(cluster, name)]
            assert served, "neither replica had served yet"
            victim = served[0]
            before = stream.ok
            status = terminate(cluster, victim, timeout=120)
            stream.more(100)
        assert stream.failures == [], (
            f"{len(stream.failures)} failed of {stream.ok + len(stream.failures)}: {stream.failures[:3]}"
        )
        assert status == 0
        assert stream.ok >= before + 100
        first_log = log_of(cluster, victim)
        assert "listener closed; waiting up to 95s" in first_log and "drained; finishing requests in flight" in first_log
        assert "closing" not in first_log.split("listener closed", 1)[1], "every connection ended before the drain timed out"
    finally:
        stop_all(cluster, [first, second])


# --- self-managed: renewals and a CA rotation by the Lease holder, two replicas ---------------------


def test_self_managed_replicas_renew_and_rotate_the_ca_under_load_with_one_writer_and_no_failed_request(
    cluster: controlplane.State,
) -> None:
    port = controlplane.free_port()
    register(cluster, port=port, ca_bundle=b"")  # nothing trusted yet: the webhook injects its CA
    common = [
        "--port",
        str(port),
        "--reuse-port",
        "--self-managed-certs",
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--namespace",
        NAMESPACE,
        "--service",
        "",
        "--cert-host",
        "127.0.0.1",
        "--cert-check-interval",
        "0.5s",
        # A year of renewals in seconds: a serving certificate every ~6 s, a new CA after ~16 s.
        "--cert-validity",
        "12s",
        "--renew-before",
        "6s",
        "--ca-validity",
        "30s",
        "--ca-renew-before",
        "14s",
        "--ca-propagation-delay",
        "2s",
        "--drain-idle-seconds",
        "95",
    ]
    replicas = [start(cluster, *common), start(cluster, *common)]
    try:
        eventually(lambda: admitted(cluster), what="the injected caBundle trusted by the apiserver")
        secret = json.loads(
            controlplane.kubectl(cluster, "get", "secret", "gpu-admission-webhook-tls", "-n", NAMESPACE, "-o", "json").stdout
        )
        assert secret["type"] == "kubernetes.io/tls"
        assert sorted(secret["data"]) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
        assert secret["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpu-admission"
        first_ca = rotation.parse({k: base64.b64decode(v) for k, v in secret["data"].items()}).trusted[0]

        def stored() -> rotation.Material:
            data = json.loads(
                controlplane.kubectl(cluster, "get", "secret", "gpu-admission-webhook-tls", "-n", NAMESPACE, "-o", "json").stdout
            )["data"]
            return rotation.parse({k: base64.b64decode(v) for k, v in data.items()})

        def rotated_and_served() -> bool:
            material = stored()
            return (
                material.ca is not None
                and material.serving is not None
                and material.ca.certificate != first_ca
                and rotation.signed_by(material.serving.certificate, material.ca.certificate)
                and rotation.signed_by(served(port, ca_bundle=material.bundle_pem()), material.ca.certificate)
            )

        with Stream(cluster) as stream:
            stream.more(30)
            eventually(rotated_and_served, what="a CA rotation completed and served", timeout=90)
            stream.more(30)
        assert stream.failures == [], (
            f"{len(stream.failures)} failed of {stream.ok + len(stream.failures)}: {stream.failures[:3]}"
        )
        logs = {name: log_of(cluster, name) for name in replicas}
        writers = [name for name, text in logs.items() if "issued" in text]
        assert len(writers) == 1, "exactly one replica (the Lease holder) writes the Secret"
        [writer] = writers
        assert logs[writer].count("issued a new one") >= 2 and "issued a new CA, the old one stays trusted" in logs[writer]
        for text in logs.values():
            assert text.count("now serving the certificate from secret") >= 3, "every replica reloads each renewal"
        lease = json.loads(
            controlplane.kubectl(cluster, "get", "lease", "gpu-admission-webhook-certs", "-n", NAMESPACE, "-o", "json").stdout
        )
        assert lease["spec"]["holderIdentity"] is not None
        eventually(
            lambda: all(bundle == stored().bundle_pem() for bundle in bundles(cluster)), what="every caBundle equal to ca.crt"
        )
    finally:
        stop_all(cluster, replicas)


# --- the manual flows against a cluster -----------------------------------------------------------


def test_certs_install_then_show_reports_the_secret_and_the_trust_of_the_caBundles(cluster: controlplane.State) -> None:
    secret = f"install-{uuid.uuid4().hex[:6]}"
    where = [
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--namespace",
        NAMESPACE,
        "--certs-secret",
        secret,
        "--webhook-configuration",
        CONFIGURATION,
    ]
    installed = subprocess.run(
        [install.executable(), "certs", "install", *where], capture_output=True, text=True, timeout=60, check=False
    )
    assert installed.returncode == 0, installed.stderr
    assert "no CA stored: issued a new CA" in installed.stdout and "caBundle(s) updated" in installed.stdout
    shown = subprocess.run(
        [install.executable(), "certs", "show", *where, "-o", "json"], capture_output=True, text=True, timeout=60, check=False
    )
    assert shown.returncode == 0, shown.stderr
    report: dict[str, Any] = json.loads(shown.stdout)
    roles = {row["role"]: row for row in report["certificates"]}
    assert set(roles) == {"ca", "serving"}
    assert roles["ca"]["trustedByClients"] == roles["ca"]["clients"] == len(bundles(cluster))
    assert "gpu-admission-webhook.gpu-admission.svc" in roles["serving"]["sans"]
    left = datetime.timedelta(days=roles["serving"]["daysLeft"])
    assert datetime.timedelta(days=364) < left <= datetime.timedelta(days=365)
