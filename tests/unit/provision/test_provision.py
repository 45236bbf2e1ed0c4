"""Self-managed certificates: the Secret is created and renewed by one writer, the caBundles follow,
every replica serves what the Secret holds; and the kube adapters write what the API expects."""

from __future__ import annotations

import base64
import datetime
import json
import ssl
from collections.abc import Mapping
from typing import Any

import pytest
from kubernetes.client import exceptions as client_exceptions

from certs import authority, rotation
from tests.unit.provision.conftest import MemoryClients, MemoryLeases, MemoryStore, presented_certificate
from webhook.certificates import provision
from webhook.kube import errors as kube_errors
from webhook.kube import leader
from webhook.serving import metrics, tls

NOW = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)
HOSTS = provision.Target().hosts


# --- one pass -------------------------------------------------------------------------------------


def test_an_empty_secret_gets_a_ca_and_serving_pair_and_every_cabundle_the_ca(store: MemoryStore, clients: MemoryClients) -> None:
    outcome = provision.reconcile(store, clients, hosts=HOSTS, now=NOW)
    assert outcome.written and outcome.injected == 2
    assert store.stored is not None and sorted(store.stored.entries) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]
    assert clients.values == [store.stored.entries["ca.crt"]] * 2
    assert outcome.material.serving is not None and rotation.covers(outcome.material.serving.certificate, HOSTS)


def test_a_second_pass_writes_and_injects_nothing(store: MemoryStore, clients: MemoryClients) -> None:
    provision.reconcile(store, clients, hosts=HOSTS, now=NOW)
    again = provision.reconcile(store, clients, hosts=HOSTS, now=NOW + datetime.timedelta(days=1))
    assert not again.written and again.injected == 0 and store.writes == 1 and clients.injections == 1


def test_a_cabundle_reset_by_someone_else_is_injected_again(store: MemoryStore, clients: MemoryClients) -> None:
    provision.reconcile(store, clients, hosts=HOSTS, now=NOW)
    clients.values[1] = b""  # e.g. the configurations deleted and re-applied without caBundle
    assert provision.reconcile(store, clients, hosts=HOSTS, now=NOW).injected == 1


def test_a_write_based_on_a_stale_read_is_a_conflict_and_injects_nothing(store: MemoryStore, clients: MemoryClients) -> None:
    provision.reconcile(store, clients, hosts=HOSTS, now=NOW)
    original = store.read
    store.read = lambda: provision.Stored(entries={}, version="0")  # type: ignore[method-assign]  # a stale view
    with pytest.raises(kube_errors.Conflict):
        provision.reconcile(store, MemoryClients(), hosts=HOSTS, now=NOW)
    store.read = original  # type: ignore[method-assign]
    assert store.writes == 1


def test_a_ca_rotation_takes_two_passes_with_the_bundle_injected_between(store: MemoryStore, clients: MemoryClients) -> None:
    policy = rotation.Policy(ca_propagation=datetime.timedelta(seconds=30))
    first = provision.reconcile(store, clients, hosts=HOSTS, now=NOW, policy=policy)
    old_ca = first.material.trusted[0]
    step1 = provision.reconcile(store, clients, hosts=HOSTS, now=NOW, policy=policy, rotate_ca=True)
    assert step1.written and step1.injected == 2 and step1.waiting
    assert all(rotation.parse_bundle(value)[1:] == (old_ca,) for value in clients.values), "old CA still trusted"
    assert step1.material.serving is not None and rotation.signed_by(step1.material.serving.certificate, old_ca)
    step2 = provision.reconcile(store, clients, hosts=HOSTS, now=NOW + datetime.timedelta(seconds=30), policy=policy)
    assert step2.written and step2.waiting == "" and step2.material.ca is not None and step2.material.serving is not None
    assert rotation.signed_by(step2.material.serving.certificate, step2.material.ca.certificate)


def test_without_clients_nothing_is_injected_and_a_new_ca_serves_only_on_request(store: MemoryStore) -> None:
    provision.reconcile(store, None, hosts=HOSTS, now=NOW)
    provision.reconcile(store, None, hosts=HOSTS, now=NOW, rotate_ca=True)
    later = provision.reconcile(store, None, hosts=HOSTS, now=NOW + datetime.timedelta(days=1))
    assert not later.written and "previous CA" in later.waiting


def test_target_hosts_are_the_service_names_then_the_extra_hosts_each_once() -> None:
    target = provision.Target(namespace="ns", service="hook", extra_hosts=("127.0.0.1", "hook.ns.svc"))
    assert target.hosts == ("hook", "hook.ns", "hook.ns.svc", "hook.ns.svc.cluster.local", "127.0.0.1")
    assert provision.Target(service="", extra_hosts=("127.0.0.1",)).hosts == ("127.0.0.1",)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("365d", 365 * 86400), ("60d", 60 * 86400), ("1h30m", 5400), ("90s", 90), ("0.5s", 0.5), ("12", 12), ("500ms", 0.5)],
)
def test_durations(text: str, seconds: float) -> None:
    assert provision.duration(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["", "ten", "5 d", "-1", "1y"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        provision.duration(text)


# --- the manager in serve -------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> datetime.datetime:
        return self.now


def manager(store: MemoryStore, clients: MemoryClients, leases: MemoryLeases, identity: str, clock: Clock) -> provision.Manager:
    elector = leader.Elector(leases, namespace="gpu-admission", name="certs", identity=identity, duration_s=15, retry_s=5.0)
    gauge = tls.expiry_gauge(metrics.Registry())
    made = provision.Manager(store, clients, hosts=HOSTS, elector=elector, interval=1.0, clock=clock)
    made.serving = tls.Serving(tls.new_server_context(), gauge=gauge)
    return made


def served_serial(context: ssl.SSLContext) -> int:
    """The serial of the certificate ``context`` presents."""
    return presented_certificate(context, server_hostname=provision.SERVICE + ".gpu-admission.svc").serial_number


async def test_one_replica_writes_and_both_serve_every_renewal(
    store: MemoryStore, clients: MemoryClients, leases: MemoryLeases
) -> None:
    clock = Clock()
    first, second = manager(store, clients, leases, "a", clock), manager(store, clients, leases, "b", clock)
    material = await first.bootstrap(retry_s=0)
    assert first.elector.leader and store.writes == 1
    assert (await second.bootstrap(retry_s=0)).serving is not None and not second.elector.leader
    assert store.writes == 1, "the follower wrote nothing"
    for one in (first, second):
        one.apply(material)
    assert first.serving is not None and second.serving is not None
    assert first.serving.fingerprint == second.serving.fingerprint != b""
    initial = served_serial(second.serving.context)

    clock.now += authority.SERVING_VALIDITY - rotation.SERVING_RENEW_BEFORE  # renewal due
    await first.elector.step()
    await second.elector.step()
    await second.tick()
    assert store.writes == 1, "not the leader: no renewal written"
    await first.tick()
    assert store.writes == 2
    await second.tick()
    assert first.serving.fingerprint == second.serving.fingerprint
    assert second.serving.not_after == clock.now + authority.SERVING_VALIDITY
    assert served_serial(second.serving.context) == served_serial(first.serving.context) != initial


async def test_bootstrap_of_a_follower_waits_until_the_leader_has_written(
    store: MemoryStore, clients: MemoryClients, leases: MemoryLeases
) -> None:
    clock = Clock()
    first, second = manager(store, clients, leases, "a", clock), manager(store, clients, leases, "b", clock)
    await first.elector.step()  # a holds the Lease but has not written yet
    calls = 0
    original = second._pass

    def counting() -> rotation.Material:
        nonlocal calls
        calls += 1
        if calls == 2:
            provision.reconcile(store, clients, hosts=HOSTS, now=clock.now)  # the leader's first pass lands
        return original()

    second._pass = counting  # type: ignore[method-assign]  # observe the follower's passes
    material = await second.bootstrap(retry_s=0)
    assert calls == 2 and material.serving is not None and not second.elector.leader


async def test_a_stored_pair_that_does_not_load_keeps_the_served_one(
    store: MemoryStore, clients: MemoryClients, leases: MemoryLeases
) -> None:
    clock = Clock()
    one = manager(store, clients, leases, "a", clock)
    material = await one.bootstrap(retry_s=0)
    one.apply(material)
    assert one.serving is not None
    before = one.serving.fingerprint
    other = provision.reconcile(MemoryStore(), None, hosts=HOSTS, now=NOW).material
    assert other.serving is not None and material.serving is not None
    broken = rotation.Material(
        trusted=material.trusted,
        ca=material.ca,
        serving=authority.KeyPair(certificate=other.serving.certificate, key=material.serving.key),
    )
    assert not one.apply(broken)
    assert one.serving.fingerprint == before


# --- the kube adapters ----------------------------------------------------------------------------


class Response:
    def __init__(self, body: Mapping[str, Any]) -> None:
        self.data = json.dumps(body).encode()


class FakeCore:
    def __init__(self, existing: dict[str, Any] | None) -> None:
        self.existing = existing
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def read_namespaced_secret(self, name: str, namespace: str, **_: Any) -> Response:
        if self.existing is None:
            raise client_exceptions.ApiException(status=404, reason="Not Found")
        return Response(self.existing)

    def create_namespaced_secret(self, namespace: str, body: dict[str, Any], **_: Any) -> Response:
        self.calls.append(("create", body))
        return Response(body)

    def replace_namespaced_secret(self, name: str, namespace: str, body: dict[str, Any], **_: Any) -> Response:
        if body["metadata"].get("resourceVersion") != "7":
            raise client_exceptions.ApiException(status=409, reason="Conflict")
        self.calls.append(("replace", body))
        return Response(body)


def secret_store(core: FakeCore) -> provision.SecretStore:
    made = provision.SecretStore(None, namespace="gpu-admission", name=provision.SECRET)  # type: ignore[arg-type]  # the API object is replaced below
    made._core = core
    return made


def test_a_new_secret_is_created_as_kubernetes_tls_with_our_labels() -> None:
    core = FakeCore(None)
    store = secret_store(core)
    assert store.read() is None
    store.write({"tls.crt": b"c", "tls.key": b"k"}, previous=None)
    [(verb, body)] = core.calls
    assert verb == "create" and body["type"] == "kubernetes.io/tls"
    assert body["metadata"]["labels"]["app.kubernetes.io/part-of"] == "gpu-admission"
    assert body["data"] == {"tls.crt": base64.b64encode(b"c").decode(), "tls.key": base64.b64encode(b"k").decode()}


def test_an_existing_secret_is_replaced_conditionally_keeping_its_type_and_labels() -> None:
    existing = {
        "type": "Opaque",
        "metadata": {
            "name": provision.SECRET,
            "namespace": "gpu-admission",
            "resourceVersion": "7",
            "labels": {"team": "infra"},
            "managedFields": [{}],
        },
        "data": {"ca.crt": base64.b64encode(b"x").decode(), "junk": "!!not base64!!"},
    }
    core = FakeCore(existing)
    store = secret_store(core)
    stored = store.read()
    assert stored is not None and stored.version == "7" and stored.entries == {"ca.crt": b"x", "junk": b""}
    store.write({"ca.crt": b"y"}, previous=stored)
    [(verb, body)] = core.calls
    assert verb == "replace" and body["type"] == "Opaque", "a Secret's type is immutable"
    assert body["metadata"]["labels"]["team"] == "infra" and "managedFields" not in body["metadata"]
    with pytest.raises(kube_errors.Conflict):
        store.write({"ca.crt": b"z"}, previous=provision.Stored(entries={}, version="6", metadata={"resourceVersion": "6"}))


class FakeAdmission:
    def __init__(self, configurations: dict[str, dict[str, Any] | None]) -> None:
        self.configurations = configurations
        self.replaced: list[str] = []

    def __getattr__(self, attribute: str) -> Any:
        verb, kind = attribute.split("_", 1)[0], attribute.split("_")[1]

        def read(name: str, **_: Any) -> Response:
            found = self.configurations[kind]
            if found is None:
                raise client_exceptions.ApiException(status=404, reason="Not Found")
            return Response(found)

        def replace(name: str, body: dict[str, Any], **_: Any) -> Response:
            self.replaced.append(kind)
            self.configurations[kind] = body
            return Response(body)

        return read if verb == "read" else replace


def test_inject_sets_every_entry_of_both_configurations_and_skips_what_is_current_or_absent() -> None:
    hooks = [{"name": "a", "clientConfig": {"url": "https://x"}}, {"name": "b", "clientConfig": {"caBundle": "b2xk"}}]
    admission = FakeAdmission({"mutating": {"metadata": {"resourceVersion": "1"}, "webhooks": hooks}, "validating": None})
    clients = provision.WebhookClients(None, name="gpu-admission")  # type: ignore[arg-type]  # the API object is replaced below
    clients._admission = admission
    assert clients.bundles() == [b"", b"old"]
    assert clients.inject(b"new") == 2
    assert admission.replaced == ["mutating"]
    assert clients.bundles() == [b"new", b"new"]
    assert clients.inject(b"new") == 0 and admission.replaced == ["mutating"]
