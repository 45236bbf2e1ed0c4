"""The leader's DeviceTaintRules: a card that holds shared pods is kept from DRA allocations.

Every `every` seconds the replica that holds the Lease `gpu-admission-extender-dra` (in the
ledger namespace) compares the cards that hold extender allocations (the cache's node states) with
the devices DRA drivers publish for them (`policies.gpu.dra.card_devices`: the whole GPU and its MIG
devices, matched by UUID), and creates one DeviceTaintRule per such device (`dra.taint_rule`:
effect NoSchedule, so claims already allocated keep running) and deletes each of its own rules
(label `gpu-admission.io/shared-card=true`) whose card is empty again (`dra.plan_rules`).

The API's version is found by listing: `resource.k8s.io/v1beta2` (Kubernetes 1.36), else
`v1alpha3` (1.33 to 1.35, behind the `DRADeviceTaints` feature gate and runtime-config). Where
neither is served (Kubernetes as shipped up to 1.36), the keeper holds each such device with a
ResourceClaim of its own in the ledger namespace instead (`dra.hold_claim`), whose
`status.allocation` names the device: kube-scheduler's allocator counts every device of an
allocated claim as in use. A hold is released by clearing its allocation first (kube-scheduler
requeues pods waiting for devices on a deallocation, not on a claim's deletion), then deleting the
claim. It looks for the rule API again every `rediscover_s`; once rules are served, its hold
claims are released. docs/dra.md has the evidence from the Kubernetes sources. Failures are logged
and tried again next pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from policies import podspec
from policies.gpu import dra, reservations
from webhook.extender import kube
from webhook.extender import store as store_module
from webhook.kube import errors as kube_errors
from webhook.kube import leader

log = logging.getLogger(__name__)

LEASE_NAME = "gpu-admission-extender-dra"
EVERY_S = 5.0
REDISCOVER_S = 300.0


def rules_path(version: str, name: str = "") -> str:
    base = f"/apis/{dra.GROUP}/{version}/devicetaintrules"
    return f"{base}/{name}" if name else base


_CLAIM_TYPE = {"apiVersion": f"{dra.GROUP}/{dra.VERSION}", "kind": "ResourceClaim"}  # a list's items carry neither


def claims_path(namespace: str, name: str = "", *, status: bool = False) -> str:
    base = f"/apis/{dra.GROUP}/{dra.VERSION}/namespaces/{namespace}/resourceclaims"
    path = f"{base}/{name}" if name else base
    return f"{path}/status" if status else path


class Keeper:
    """Keeps the extender's DeviceTaintRules in step with the cards that hold shared pods."""

    def __init__(
        self,
        api: kube.KubeApi,
        cache: store_module.Store,
        *,
        elector: leader.Elector | None,
        ttl: float,
        clock: Callable[[], float] = time.time,
        every: float = EVERY_S,
        rediscover_s: float = REDISCOVER_S,
        namespace: str = reservations.LEDGER_NAMESPACE,
    ) -> None:
        self._api = api
        self._namespace = namespace  # the ledger namespace: where the hold claims live
        self._cache = cache
        self._elector = elector
        self._ttl = ttl
        self._clock = clock
        self._every = every
        self._rediscover_s = rediscover_s
        self._version: str | None = None
        self._looked_at = float("-inf")

    @property
    def version(self) -> str | None:
        """The DeviceTaintRule version in use; None while none is served (or not looked yet)."""
        return self._version

    async def run(self) -> None:
        """Contend for the Lease (where there is an elector) and reconcile every `every` seconds, for ever."""
        async with contextlib.AsyncExitStack() as stack:
            if self._elector is not None:
                await stack.enter_async_context(leader.elected(self._elector))
            while True:
                await asyncio.sleep(self._every)
                try:
                    await self.reconcile()
                except Exception:  # noqa: BLE001 - best effort: the next pass tries again
                    log.warning("keeping the DRA taint rules failed", exc_info=True)

    def busy_cards(self) -> dict[str, set[str]]:
        """Node -> UUIDs of cards that hold extender allocations (pods bound or reserved)."""
        now = self._clock()
        found: dict[str, set[str]] = {}
        for name, state in self._cache.all_states(now=now, ttl=self._ttl).items():
            uuids = {c.card.uuid for c in state.cards if c.allocations and c.card.uuid}
            if uuids:
                found[name] = uuids
        return found

    def _leads(self) -> bool:
        return self._elector is None or self._elector.leader

    async def reconcile(self) -> tuple[int, int]:
        """One pass: (rules or hold claims created, rules or hold claims released). Nothing while
        this replica does not lead or the cache is not synced."""
        cache = self._cache
        if not (cache.synced and cache.slices_synced) or not self._leads():
            return 0, 0
        version = await self._discover()
        wanted = dra.devices_to_taint(dra.card_devices(cache.slices()), self.busy_cards())
        # Hold claims where no rule API is served; where one is, any left from before are released.
        held, released = await self._reconcile_holds(() if version is not None else wanted)
        if version is None:
            return held, released
        created, deleted = await self._reconcile_rules(version, wanted)
        return created + held, deleted + released

    async def _reconcile_rules(self, version: str, wanted: tuple[dra.Device, ...]) -> tuple[int, int]:
        existing, _ = await asyncio.to_thread(self._api.list, rules_path(version), label_selector=f"{dra.RULE_LABEL}=true")
        create, delete = dra.plan_rules(wanted, existing)
        for device in create:
            if self._elector is not None and not self._elector.leader:
                break  # re-checked before every write
            try:
                await asyncio.to_thread(
                    self._api.request, "POST", rules_path(version), body=dra.taint_rule(device, version=version)
                )
                log.info(
                    "DeviceTaintRule %s keeps %s/%s/%s (card %s on %s) from DRA",
                    dra.rule_name(device),
                    *device.key,
                    device.card_uuid,
                    device.node,
                )
            except kube_errors.Conflict:
                pass  # it exists already (another pass, another leader): the next list shows it
        for name in delete:
            if self._elector is not None and not self._elector.leader:
                break
            try:
                await asyncio.to_thread(self._api.request, "DELETE", rules_path(version, name))
                log.info("DeviceTaintRule %s removed: its card holds no shared pod any more", name)
            except kube_errors.NotFound:
                pass
        return len(create), len(delete)

    async def _reconcile_holds(self, wanted: tuple[dra.Device, ...]) -> tuple[int, int]:
        """The hold claims: one allocated claim per wanted device, the others released."""
        try:
            existing, _ = await asyncio.to_thread(
                self._api.list, claims_path(self._namespace), label_selector=f"{dra.RULE_LABEL}=true"
            )
        except kube_errors.NotFound:
            return 0, 0  # resource.k8s.io/v1 is not served: nothing for DRA to allocate either
        create, unallocated, release = dra.plan_holds(wanted, existing)
        by_name = {str(podspec.mapping(c.get("metadata")).get("name", "")): c for c in existing}
        done = 0
        for device in create:
            if not self._leads():
                break  # re-checked before every write
            try:
                claim = await asyncio.to_thread(
                    self._api.request,
                    "POST",
                    claims_path(self._namespace),
                    body=dra.hold_claim(device, namespace=self._namespace),
                )
            except kube_errors.Conflict:
                continue  # it exists already: the next pass allocates it where it is not
            done += await self._allocate(claim, device)
        for device in unallocated:
            if self._leads():
                done += await self._allocate(by_name[dra.rule_name(device)], device)
        for name in release:
            if not self._leads():
                break
            await self._release(by_name[name])
        return done, len(release)

    async def _allocate(self, claim: Mapping[str, Any], device: dra.Device) -> int:
        body = {**claim, **_CLAIM_TYPE, "status": {"allocation": dra.hold_allocation(device)}}
        name = str(podspec.mapping(claim.get("metadata")).get("name", ""))
        try:
            await asyncio.to_thread(self._api.request, "PUT", claims_path(self._namespace, name, status=True), body=body)
        except (kube_errors.Conflict, kube_errors.NotFound):
            return 0  # changed or gone meanwhile: the next pass sees it as it is
        log.info(
            "ResourceClaim %s/%s holds %s/%s/%s (card %s on %s) from DRA",
            self._namespace,
            name,
            *device.key,
            device.card_uuid,
            device.node,
        )
        return 1

    async def _release(self, claim: Mapping[str, Any]) -> None:
        """Deallocate, then delete: kube-scheduler requeues pods that wait for devices when a claim
        is deallocated (`isSchedulableAfterClaimChange`); it registers no event for a deletion."""
        name = str(podspec.mapping(claim.get("metadata")).get("name", ""))
        try:
            if dra.claim_results(claim):
                await asyncio.to_thread(
                    self._api.request,
                    "PUT",
                    claims_path(self._namespace, name, status=True),
                    body={**claim, **_CLAIM_TYPE, "status": {"allocation": None}},
                )
            await asyncio.to_thread(self._api.request, "DELETE", claims_path(self._namespace, name))
            log.info("ResourceClaim %s/%s released: its card holds no shared pod any more", self._namespace, name)
        except (kube_errors.Conflict, kube_errors.NotFound):
            pass  # changed or gone meanwhile: the next pass sees it as it is

    async def _discover(self) -> str | None:
        now = time.monotonic()
        if self._version is not None or now - self._looked_at < self._rediscover_s:
            return self._version
        self._looked_at = now
        for version in dra.TAINT_RULE_VERSIONS:
            try:
                await asyncio.to_thread(self._api.request, "GET", rules_path(version), query=[("limit", "1")])
            except kube_errors.NotFound:
                continue
            self._version = version
            log.info("DRA taint rules: using %s/%s DeviceTaintRule", dra.GROUP, version)
            return version
        log.info(
            "no DeviceTaintRule API (%s): cards that hold shared pods are kept from DRA by ResourceClaims in %s labelled %s "
            "(see docs/dra.md)",
            ", ".join(f"{dra.GROUP}/{v}" for v in dra.TAINT_RULE_VERSIONS),
            self._namespace,
            dra.RULE_LABEL,
        )
        return None


def elector_for(client: Any, *, namespace: str) -> leader.Elector:
    """The Lease election among extender replicas for the taint rules."""
    return leader.Elector(
        leader.KubeLeaseStore(client, namespace=namespace, name=LEASE_NAME),
        namespace=namespace,
        name=LEASE_NAME,
        identity=leader.identity(),
    )
