"""Leader election among replicas over a coordination.k8s.io/v1 Lease, for asyncio code.

Use it for work that exactly one replica may do (writing the certificate Secret, a background
audit)::

    elector = leader.Elector(leader.KubeLeaseStore(api, namespace=ns, name="my-lease"),
                             namespace=ns, name="my-lease", identity=leader.identity())
    async with leader.elected(elector):          # renews in a task; released on exit
        ...
        if elector.leader:                       # re-check right before every write
            ...

The rules are client-go's, as implemented by the pure step function in `webhook.kube.lease`
(create, renew, take over after ``duration_s`` of *local* time without a change, HTTP 409 = lost
the race), timed by the monotonic clock. `Elector.leader` turns false by itself when renewals have failed for ``renew_deadline_s``
(two thirds of the lease), before any other replica may take over, so two replicas never both
believe they lead. Blocking client calls run in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Protocol

from webhook.kube import client, lease, retry
from webhook.kube import errors as kube_errors

log = logging.getLogger(__name__)

DEFAULT_DURATION_S = lease.DEFAULT_DURATION_S
DEFAULT_RETRY_S = lease.DEFAULT_RETRY_S
REQUEST_TIMEOUT_S = 5  # below the renew deadline: a hung call must not outlive our claim


class LeaseStore(Protocol):
    """Where the Lease lives: the apiserver, or a dict in tests. Failures are `webhook.kube.errors`
    types; a write that lost the race is `errors.Conflict`."""

    def read(self) -> Mapping[str, Any] | None: ...

    def write(self, body: Mapping[str, Any], *, create: bool) -> Mapping[str, Any]: ...


class KubeLeaseStore:
    """One Lease through the kubernetes client (blocking: call from a thread).

    Each call is tried once (`retry.ONCE`): the election itself tries again every ``retry_s``, and
    a call retried with backoff could outlive the renew deadline it serves."""

    def __init__(self, api: client.ApiClient, *, namespace: str, name: str) -> None:
        self._leases: Any = client.CoordinationV1Api(api)  # untyped client: Any stops here
        self.namespace = namespace
        self.name = name

    def read(self) -> Mapping[str, Any] | None:
        try:
            response = retry.call(
                lambda: self._leases.read_namespaced_lease(
                    self.name, self.namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
                ),
                what=f"cannot read lease {self.namespace}/{self.name}",
                idempotent=True,
                backoff=retry.ONCE,
            )
        except kube_errors.NotFound:
            return None
        found: dict[str, Any] = json.loads(response.data)
        return found

    def write(self, body: Mapping[str, Any], *, create: bool) -> Mapping[str, Any]:
        if create:
            response = retry.call(
                lambda: self._leases.create_namespaced_lease(
                    self.namespace, dict(body), _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
                ),
                what=f"cannot create lease {self.namespace}/{self.name}",
                idempotent=False,
                backoff=retry.ONCE,
            )
        else:  # the body carries the resourceVersion it was read at: a stale write is a 409
            response = retry.call(
                lambda: self._leases.replace_namespaced_lease(
                    self.name, self.namespace, dict(body), _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
                ),
                what=f"cannot write lease {self.namespace}/{self.name}",
                idempotent=True,
                backoff=retry.ONCE,
            )
        written: dict[str, Any] = json.loads(response.data)
        return written


def identity() -> str:
    """This replica's name in a Lease: the pod name (hostname) and a per-process suffix."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class Elector:
    """One replica's view of one Lease: `step` contends or renews, `run` does it every ``retry_s``."""

    def __init__(
        self,
        store: LeaseStore,
        *,
        namespace: str,
        name: str,
        identity: str,
        duration_s: int = DEFAULT_DURATION_S,
        retry_s: float = DEFAULT_RETRY_S,
        labels: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < retry_s < duration_s:
            raise ValueError("the retry period must be positive and shorter than the lease duration")
        self.store = store
        self.election = lease.Election(namespace=namespace, name=name, identity=identity, duration_s=duration_s)
        self.retry_s = retry_s
        self.renew_deadline_s = duration_s * 2 / 3
        self.labels = dict(labels or {})
        self._clock = clock
        self._monotonic = monotonic
        self._observed: lease.Observation | None = None
        self._held_until = float("-inf")
        self._was_leader = False

    @property
    def identity(self) -> str:
        return self.election.identity

    @property
    def leader(self) -> bool:
        """Whether this replica holds the Lease now (false once renewals lapse, before anyone may take over)."""
        return self._monotonic() < self._held_until

    def _step(self) -> bool:
        started = self._monotonic()
        current = self.store.read()
        decided = lease.step(
            current, election=self.election, now=self._clock(), observed=self._observed, monotonic=self._monotonic()
        )
        self._observed = decided.observation
        if decided.write is None:
            self._held_until = float("-inf")
            return False
        body = dict(decided.write)
        if decided.create and self.labels:
            body["metadata"] = {**body["metadata"], "labels": self.labels}
        try:
            self.store.write(body, create=decided.create)
        except kube_errors.Conflict:
            self._held_until = float("-inf")
            return False
        self._held_until = started + self.renew_deadline_s if decided.leader else float("-inf")
        return decided.leader

    async def step(self) -> bool:
        """One election round (the client call in a thread); a failed call keeps the deadline running."""
        try:
            leading = await asyncio.to_thread(self._step)
        except kube_errors.KubeError as error:
            log.warning("uid=- lease %s/%s: %s", self.election.namespace, self.election.name, error)
            leading = self.leader
        if leading != self._was_leader:
            log.info(
                "uid=- %s %s the lease %s/%s",
                self.identity,
                "holds" if leading else "no longer holds",
                self.election.namespace,
                self.election.name,
            )
            self._was_leader = leading
        return leading

    async def run(self) -> None:
        """Contend or renew every ``retry_s`` seconds, for ever."""
        while True:
            await self.step()
            await asyncio.sleep(self.retry_s)

    def _release(self) -> None:
        current = self.store.read()
        body = lease.release(current, election=self.election, now=self._clock())
        if body is not None:
            self.store.write(body, create=False)

    async def release(self) -> None:
        """Step down so that another replica takes over at once instead of after the lease expires."""
        self._held_until = float("-inf")
        try:
            await asyncio.to_thread(self._release)
        except kube_errors.KubeError as error:
            log.warning("uid=- could not release the lease %s/%s: %s", self.election.namespace, self.election.name, error)


@contextlib.asynccontextmanager
async def elected(elector: Elector) -> AsyncIterator[Elector]:
    """Run ``elector`` in a task for the body's duration, then stop and release the Lease."""
    task = asyncio.create_task(elector.run())
    try:
        yield elector
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await elector.release()
