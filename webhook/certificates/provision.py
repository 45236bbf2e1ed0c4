"""Self-managed webhook certificates in the cluster: the Secret, the caBundle injection, the renewal loop.

The decisions (renew now? which CAs to trust?) are `certs.rotation`'s; this module reads and writes:

- the *store*: the Secret ``gpu-admission-webhook-tls`` (type ``kubernetes.io/tls``; ``ca.crt`` the
  trusted CAs, signing one first; ``ca.key``; ``tls.crt``; ``tls.key``) or, for the CLI, four files;
- the *clients*: every webhook entry of the Mutating- and ValidatingWebhookConfiguration of one name,
  whose ``clientConfig.caBundle`` is set to ``ca.crt``.

`reconcile` does one pass (read, decide, write the store, inject). `Manager` runs it in ``serve
--self-managed-certs``: every replica reads the Secret every interval and swaps a changed serving
pair into its live TLS context; only the replica holding the Lease writes (see `webhook.kube.leader`).
The kubernetes client is synchronous: everything here that calls it runs in a worker thread. Its
failures are `webhook.kube.errors` types; a write that lost a race is `errors.Conflict` (read again
and decide again). Reads and resourceVersion-guarded replaces are retried on 429, 5xx and lost
connections (`webhook.kube.retry`), the Secret's create only on 429.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import datetime
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from certs import rotation
from webhook import kube
from webhook.cmdline import durations, errors
from webhook.kube import client, leader, retry
from webhook.serving import tls

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "gpu-admission"
SECRET = "gpu-admission-webhook-tls"
SERVICE = "gpu-admission-webhook"
WEBHOOK_CONFIGURATION = "gpu-admission"
LEASE = "gpu-admission-webhook-certs"
SECRET_TYPE = "kubernetes.io/tls"
REQUEST_TIMEOUT_S = 10  # the client waits for ever by default; a hung call would stall renewals
LABELS = {
    "app.kubernetes.io/name": "gpu-admission",
    "app.kubernetes.io/component": "webhook",
    "app.kubernetes.io/part-of": "gpu-admission",
    "app.kubernetes.io/managed-by": "gpu-admission",
}


# --- durations ------------------------------------------------------------------------------------


def duration(text: str) -> datetime.timedelta:
    """A duration like ``365d``, ``60d``, ``1h30m``, ``90s`` or ``500ms`` (a bare number is seconds)."""
    return datetime.timedelta(seconds=durations.seconds(text))


# --- where things are -----------------------------------------------------------------------------


def service_hosts(service: str, namespace: str) -> tuple[str, ...]:
    """The names the apiserver may use for a Service (it dials ``service.namespace.svc``)."""
    return (service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Target:
    """Which Secret holds the certificates, which Service they are for, which configurations trust them."""

    namespace: str = DEFAULT_NAMESPACE
    secret: str = SECRET
    service: str = SERVICE
    webhook_configuration: str = WEBHOOK_CONFIGURATION  # "" for none
    extra_hosts: tuple[str, ...] = ()

    @property
    def hosts(self) -> tuple[str, ...]:
        named = service_hosts(self.service, self.namespace) if self.service else ()
        return tuple(dict.fromkeys((*named, *self.extra_hosts)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Stored:
    """What a store holds now; ``version`` makes the next write conditional (None: absent)."""

    entries: Mapping[str, bytes]
    version: str | None = None
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    kind: str = SECRET_TYPE


class Store(Protocol):
    """Where the four entries live (a Secret; files for the CLI)."""

    def describe(self) -> str: ...

    def read(self) -> Stored | None: ...

    def write(self, entries: Mapping[str, bytes], *, previous: Stored | None) -> None: ...


class Clients(Protocol):
    """Who must trust the CA: caBundles to read and to set."""

    def describe(self) -> str: ...

    def bundles(self) -> list[bytes]: ...

    def inject(self, bundle: bytes) -> int: ...


class NoClients:
    """Nothing to keep in step (no webhook configuration named)."""

    def describe(self) -> str:
        return "no webhook configuration"

    def bundles(self) -> list[bytes]:
        return []

    def inject(self, bundle: bytes) -> int:
        return 0


class SecretStore:
    """The certificate Secret through the kubernetes client (blocking)."""

    def __init__(self, api: client.ApiClient, *, namespace: str, name: str) -> None:
        self._core: Any = client.CoreV1Api(api)
        self.namespace = namespace
        self.name = name

    def describe(self) -> str:
        return f"secret {self.namespace}/{self.name}"

    def read(self) -> Stored | None:
        try:
            response = retry.call(
                lambda: self._core.read_namespaced_secret(
                    self.name, self.namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
                ),
                what=f"cannot read {self.describe()}",
                idempotent=True,
            )
        except kube.errors.NotFound:
            return None
        secret = json.loads(response.data)
        entries: dict[str, bytes] = {}
        for key, value in (secret.get("data") or {}).items():
            try:
                entries[key] = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                entries[key] = b""
        metadata = secret.get("metadata") or {}
        return Stored(
            entries=entries, version=metadata.get("resourceVersion"), metadata=metadata, kind=secret.get("type") or "Opaque"
        )

    def write(self, entries: Mapping[str, bytes], *, previous: Stored | None) -> None:
        metadata: dict[str, Any] = (
            dict(previous.metadata) if previous is not None else {"name": self.name, "namespace": self.namespace}
        )
        metadata["labels"] = {**(metadata.get("labels") or {}), **LABELS}
        for transient in ("managedFields", "creationTimestamp", "uid"):
            metadata.pop(transient, None)
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata,
            # The type is immutable: keep what an existing Secret has (e.g. one made by hand as Opaque).
            "type": previous.kind if previous is not None else SECRET_TYPE,
            "data": {key: base64.b64encode(value).decode("ascii") for key, value in sorted(entries.items())},
        }
        what = f"cannot write {self.describe()}"
        if previous is None:  # a create that lost its answer may have happened: 429 only is retried
            retry.call(
                lambda: self._core.create_namespaced_secret(
                    self.namespace, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
                ),
                what=what,
                idempotent=False,
            )
        else:  # metadata carries the resourceVersion read: a repeat that lost is a 409
            retry.call(
                lambda: self._core.replace_namespaced_secret(
                    self.name, self.namespace, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
                ),
                what=what,
                idempotent=True,
            )


_KINDS = ("mutating", "validating")


class WebhookClients:
    """Both webhook configurations of one name: every entry's ``clientConfig.caBundle``."""

    def __init__(self, api: client.ApiClient, *, name: str) -> None:
        self._admission: Any = client.AdmissionregistrationV1Api(api)
        self.name = name

    def describe(self) -> str:
        return f"webhook configurations {self.name}"

    def _read(self, kind: str) -> dict[str, Any] | None:
        reader = getattr(self._admission, f"read_{kind}_webhook_configuration")
        try:
            response = retry.call(
                lambda: reader(self.name, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S),
                what=f"cannot read the {kind} webhook configuration {self.name}",
                idempotent=True,
            )
        except kube.errors.NotFound:
            return None
        found: dict[str, Any] = json.loads(response.data)
        return found

    def bundles(self) -> list[bytes]:
        found: list[bytes] = []
        for kind in _KINDS:
            configuration = self._read(kind)
            for hook in (configuration or {}).get("webhooks") or []:
                encoded = (hook.get("clientConfig") or {}).get("caBundle") or ""
                try:
                    found.append(base64.b64decode(encoded, validate=True))
                except (binascii.Error, ValueError):
                    found.append(b"")
        return found

    def inject(self, bundle: bytes) -> int:
        """Set every entry's caBundle to ``bundle``; the number of entries changed (0: all had it)."""
        encoded = base64.b64encode(bundle).decode("ascii")
        changed = 0
        for kind in _KINDS:
            for attempt in range(3):
                try:
                    changed += self._inject_one(kind, encoded)
                    break
                except kube.errors.Conflict:
                    if attempt == 2:
                        raise
        return changed

    def _inject_one(self, kind: str, encoded: str) -> int:
        configuration = self._read(kind)
        if configuration is None:
            return 0
        stale = [
            hook for hook in configuration.get("webhooks") or [] if (hook.get("clientConfig") or {}).get("caBundle") != encoded
        ]
        if not stale:
            return 0
        for hook in stale:
            hook.setdefault("clientConfig", {})["caBundle"] = encoded
        replace = getattr(self._admission, f"replace_{kind}_webhook_configuration")
        # The body carries resourceVersion: a concurrent change is a 409, never overwritten.
        retry.call(
            lambda: replace(self.name, configuration, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S),
            what=f"cannot update the {kind} webhook configuration {self.name}",
            idempotent=True,
        )
        return len(stale)


# --- one pass -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
    """What a pass found and did."""

    material: rotation.Material
    reasons: tuple[str, ...] = ()
    waiting: str = ""
    written: bool = False
    injected: int = 0


def read(store: Store) -> rotation.Material:
    """The stored material, parsed (empty when nothing is stored)."""
    stored = store.read()
    return rotation.parse(dict(stored.entries) if stored is not None else {})


def reconcile(
    store: Store,
    clients: Clients | None,
    *,
    hosts: Sequence[str],
    now: datetime.datetime,
    policy: rotation.Policy = rotation.Policy(),
    rotate_ca: bool = False,
    rotate_serving: bool = False,
) -> Outcome:
    """Read the store, renew what is due, write it back (conditionally), then inject the bundle.

    ``clients`` None means they are not reachable from here (files without a cluster): nothing is
    injected and a serving certificate from a new CA waits for ``rotate_serving``.
    """
    stored = store.read()
    material = rotation.parse(dict(stored.entries) if stored is not None else {})
    bundles = clients.bundles() if clients is not None else None
    plan = rotation.reconcile(
        material, hosts=hosts, now=now, policy=policy, client_bundles=bundles, rotate_ca=rotate_ca, rotate_serving=rotate_serving
    )
    if plan.changed:
        store.write(plan.material.files(), previous=stored)
        for reason in plan.reasons:
            log.info("uid=- %s: %s", store.describe(), reason)
    injected = clients.inject(plan.material.bundle_pem()) if clients is not None else 0
    waiting = plan.waiting
    if injected:
        log.info(
            "uid=- %s: set caBundle in %d webhook entr%s",
            clients.describe() if clients else "",
            injected,
            "y" if injected == 1 else "ies",
        )
        if waiting:  # decided on the bundles as read before this injection
            waiting = "the new CA was injected just now: the serving certificate from it follows once it has propagated"
    return Outcome(material=plan.material, reasons=plan.reasons, waiting=waiting, written=plan.changed, injected=injected)


# --- in serve -------------------------------------------------------------------------------------


def usable(material: rotation.Material, *, now: datetime.datetime) -> bool:
    """Whether the stored serving pair can be served now."""
    return material.serving is not None and not rotation.expired(material.serving.certificate, now=now)


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


class Manager:
    """``serve --self-managed-certs``: bootstrap, then every interval renew (leader) and reload (all)."""

    def __init__(
        self,
        store: Store,
        clients: Clients,
        *,
        hosts: Sequence[str],
        elector: leader.Elector,
        policy: rotation.Policy = rotation.Policy(),
        interval: float = 10.0,
        clock: Callable[[], datetime.datetime] = _utcnow,
    ) -> None:
        self.store = store
        self.clients = clients
        self.hosts = tuple(hosts)
        self.elector = elector
        self.policy = policy
        self.interval = interval
        self.clock = clock
        self.serving: tls.Serving | None = None
        self.passes = 0
        self.last_error = ""
        self._waiting = ""

    def _pass(self) -> rotation.Material:
        """Blocking: the leader reconciles, the others read."""
        if self.elector.leader:
            outcome = reconcile(self.store, self.clients, hosts=self.hosts, now=self.clock(), policy=self.policy)
            if outcome.waiting != self._waiting:
                if outcome.waiting:
                    log.info("uid=- %s: %s", self.store.describe(), outcome.waiting)
                self._waiting = outcome.waiting
            return outcome.material
        return read(self.store)

    async def bootstrap(self, *, retry_s: float = 2.0) -> rotation.Material:
        """Until the store holds a usable serving pair: contend for the Lease, and create it if leading."""
        while True:
            await self.elector.step()
            try:
                material = await asyncio.to_thread(self._pass)
            except kube.errors.KubeError as error:
                material = rotation.Material()
                self._report(error)
            if usable(material, now=self.clock()):
                return material
            log.info("uid=- waiting for a serving certificate in %s", self.store.describe())
            await asyncio.sleep(retry_s)

    def apply(self, material: rotation.Material) -> bool:
        """Serve the stored pair if it changed (the event loop's thread: the live context is not thread-safe)."""
        if self.serving is None or material.serving is None:
            return False
        if material.ca is not None:
            self.serving.set_ca(material.ca.certificate)
        try:
            loaded = self.serving.offer(
                certificate_pem=material.serving.certificate_pem, key_pem=material.serving.key_pem, source=self.store.describe()
            )
        except errors.InputError as error:
            log.error("uid=- kept the previous certificate: %s", error)
            return False
        if loaded:
            log.info("uid=- now serving the certificate from %s (expires %s)", self.store.describe(), self.serving.not_after)
        return loaded

    async def tick(self) -> None:
        """One pass (the client calls in a thread), then swap the pair in if it changed."""
        try:
            material = await asyncio.to_thread(self._pass)
        except kube.errors.KubeError as error:
            self._report(error)
            return
        self.last_error = ""
        self.passes += 1
        self.apply(material)

    def _report(self, error: kube.errors.KubeError) -> None:
        message = str(error)
        if isinstance(error, kube.errors.Conflict):
            log.info("uid=- %s; trying again next pass", message)
        elif message != self.last_error:
            log.warning("uid=- certificates: %s", message)
        self.last_error = message

    async def run(self) -> None:
        """Every ``interval`` seconds, for ever."""
        while True:
            await asyncio.sleep(self.interval)
            await self.tick()
