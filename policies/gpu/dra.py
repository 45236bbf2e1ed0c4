"""Dynamic Resource Allocation as the GPU model reads it: ResourceSlices, ResourceClaims and taint rules.

One decoder for `resource.k8s.io/v1` objects, used by the extender's accounting, `inspect`,
`explain`/`simulate`/`defrag`, the audit and admission, so they can never disagree about which of
our cards a DRA driver has handed out.

- A ResourceSlice (`spec.driver`, `spec.pool.{name,generation}`, `spec.nodeName`, `spec.devices[]`)
  publishes devices. A device is matched to one of our cards by its UUID attribute. NVIDIA's driver
  (`gpu.nvidia.com`; `cmd/gpu-kubelet-plugin/deviceinfo.go` in NVIDIA/k8s-dra-driver-gpu) writes
  the attribute `uuid` on every device (a whole GPU, a MIG device, a VFIO function) and, on a MIG
  device, `parentUUID`: the card the MIG device is carved from. The card a device occupies is its
  `parentUUID` where it has one, else its `uuid`. Attribute names are read bare (`uuid`) or
  qualified with the driver's domain (`gpu.nvidia.com/uuid`); both spellings mean the same.
  Only the newest generation of a pool counts (older slices are being replaced).
- A ResourceClaim's `status.allocation.devices.results[]` (`driver`, `pool`, `device`, `request`,
  `adminAccess`, `shareID`, `consumedCapacity`) says which device it holds. A result with
  `adminAccess: true` holds nothing (admin access is monitoring, beside whoever uses the device);
  a result with `consumedCapacity` or `shareID` is a share of the device, which still takes the card
  away from the extender's pods (a DRA driver's sharing and ours do not know of each other).
- A `DeviceTaintRule` (`resource.k8s.io/v1alpha3` in 1.33 to 1.35, `v1beta2` from 1.36) keeps a
  device from new allocations: the extender writes one per card that holds shared pods
  (`taint_rule`), naming the device by driver, pool and name.

Pure: data in, data out; a broken object reads as one that publishes or holds nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from policies import podspec
from policies.gpu import reservations

GROUP = "resource.k8s.io"
VERSION = "v1"
SLICES_PATH = f"/apis/{GROUP}/{VERSION}/resourceslices"
CLAIMS_PATH = f"/apis/{GROUP}/{VERSION}/resourceclaims"
# DeviceTaintRule's versions, newest first: v1beta2 from 1.36 (beta, off by default: gate
# DRADeviceTaintRules and runtime-config), v1alpha3 in 1.33-1.35 (alpha: gate DRADeviceTaints, from
# 1.35 also DRADeviceTaintRules, and runtime-config). docs/dra.md has the table.
TAINT_RULE_VERSIONS = ("v1beta2", "v1alpha3")
CLAIM_KINDS = frozenset({"ResourceClaim", "ResourceClaimTemplate"})

NVIDIA_DRIVER = "gpu.nvidia.com"
UUID_ATTRIBUTE = "uuid"
PARENT_UUID_ATTRIBUTE = "parentUUID"  # a MIG device's card
# Kubernetes' own gate on adminAccess (DRAAdminAccess): a claim may ask for it only in a namespace
# that carries this label with the value "true".
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"

# The extender's taint rules: the taint's key, and the label that marks a rule as ours.
TAINT_KEY = "gpu-admission.io/shared-pods"
RULE_LABEL = "gpu-admission.io/shared-card"
RULE_NODE_ANNOTATION = "gpu-admission.io/node"
RULE_CARD_ANNOTATION = "gpu-admission.io/card-uuid"

# The extender's hold claims (where no DeviceTaintRule API is served): a ResourceClaim of its own, in
# the ledger namespace, labelled RULE_LABEL, whose `status.allocation` names the device, so that
# kube-scheduler's allocator counts the device as in use. HOLD_CLASS is the class the claim's one
# request names: no DeviceClass of that name need exist (no pod uses the claim, so nothing ever
# allocates it); it is no GPU class, so admission (GPU011) has nothing to refuse.
HOLD_REQUEST = "card"
HOLD_CLASS = "gpu-admission.io-shared-card"
HOLD_DEVICE_ANNOTATION = "gpu-admission.io/device"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Device:
    """One device a ResourceSlice publishes, and the card (by UUID) it occupies."""

    driver: str
    pool: str
    name: str
    node: str  # the slice's nodeName ("" for a slice of network-attached devices)
    uuid: str  # the device's own UUID attribute
    card_uuid: str  # the card it occupies: parentUUID (MIG) or uuid; "" where it names none

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.name)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Held:
    """One device a ResourceClaim has been allocated (one entry of `status.allocation.devices.results`)."""

    namespace: str
    claim: str  # the claim's name
    uid: str
    driver: str
    pool: str
    device: str
    request: str = ""
    admin_access: bool = False
    shared: bool = False  # consumedCapacity or shareID: a share of the device, not all of it
    consumed: tuple[tuple[str, str], ...] = ()  # consumedCapacity as (name, quantity) pairs

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.device)

    @property
    def claim_key(self) -> str:
        return f"{self.namespace}/{self.claim}"

    def describe(self) -> str:
        share = (
            " (a share: " + ", ".join(f"{k}={v}" for k, v in self.consumed) + ")"
            if self.consumed
            else (" (a share)" if self.shared else "")
        )
        return f"ResourceClaim {self.claim_key} (device {self.device} of driver {self.driver}){share}"


# A node's DRA holds: card UUID -> the claims holding it.
NodeHolds = Mapping[str, tuple[Held, ...]]
NO_HOLDS: NodeHolds = {}


# --- decoding -------------------------------------------------------------------------------------


def attribute(device: Mapping[str, Any], name: str, *, driver: str) -> str:
    """A device attribute's value as a string (string, version, int or bool value), bare or
    qualified with the driver's domain; "" where absent."""
    attributes = podspec.mapping(device.get("attributes"))
    for key in (name, f"{driver}/{name}"):
        value = podspec.mapping(attributes.get(key))
        for kind in ("string", "version"):
            found = value.get(kind)
            if isinstance(found, str) and found:
                return found
        for kind in ("int", "bool"):
            if kind in value and value[kind] is not None:
                return str(value[kind])
    return ""


def slice_devices(obj: Mapping[str, Any]) -> tuple[Device, ...]:
    """The devices one ResourceSlice publishes (v1 shape: attributes directly on each device)."""
    spec = podspec.mapping(obj.get("spec"))
    driver, node = spec.get("driver"), spec.get("nodeName")
    pool = podspec.mapping(spec.get("pool")).get("name")
    if not isinstance(driver, str) or not isinstance(pool, str):
        return ()
    node = node if isinstance(node, str) else ""
    found: list[Device] = []
    for item in podspec.sequence(spec.get("devices")):
        item = podspec.mapping(item)
        # v1beta1 nests the attributes under `basic`; v1 and v1beta2 do not.
        body = podspec.mapping(item.get("basic")) or item
        name = item.get("name")
        if not isinstance(name, str) or not name:
            continue
        uuid = attribute(body, UUID_ATTRIBUTE, driver=driver)
        parent = attribute(body, PARENT_UUID_ATTRIBUTE, driver=driver)
        found.append(Device(driver=driver, pool=pool, name=name, node=node, uuid=uuid, card_uuid=parent or uuid))
    return tuple(found)


def claim_results(obj: Mapping[str, Any]) -> tuple[Held, ...]:
    """The devices a ResourceClaim has been allocated (none while it is not allocated)."""
    metadata = podspec.mapping(obj.get("metadata"))
    allocation = podspec.mapping(podspec.mapping(obj.get("status")).get("allocation"))
    results = podspec.sequence(podspec.mapping(allocation.get("devices")).get("results"))
    namespace, name, uid = (str(metadata.get(k) or "") for k in ("namespace", "name", "uid"))
    found: list[Held] = []
    for result in results:
        result = podspec.mapping(result)
        driver, pool, device = result.get("driver"), result.get("pool"), result.get("device")
        if not (isinstance(driver, str) and isinstance(pool, str) and isinstance(device, str)):
            continue
        consumed = tuple(sorted((str(k), str(v)) for k, v in podspec.mapping(result.get("consumedCapacity")).items()))
        request = result.get("request")
        found.append(
            Held(
                namespace=namespace,
                claim=name,
                uid=uid,
                driver=driver,
                pool=pool,
                device=device,
                request=request if isinstance(request, str) else "",
                admin_access=result.get("adminAccess") is True,
                shared=bool(consumed) or bool(result.get("shareID")),
                consumed=consumed,
            )
        )
    return tuple(found)


def slim_slice(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a ResourceSlice `devices` reads (what caches and snapshots keep)."""
    return {"metadata": {"name": podspec.mapping(obj.get("metadata")).get("name")}, "spec": obj.get("spec")}


def slim_claim(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of an allocated ResourceClaim `claim_results` reads."""
    metadata = podspec.mapping(obj.get("metadata"))
    return {
        "metadata": {k: metadata.get(k) for k in ("name", "namespace", "uid", "labels")},
        "status": {"allocation": podspec.mapping(obj.get("status")).get("allocation")},
    }


def devices(slices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], Device]:
    """Every published device by (driver, pool, name), from the newest generation of each pool."""
    newest: dict[tuple[str, str], int] = {}
    decoded: list[tuple[int, tuple[Device, ...]]] = []
    for obj in slices:
        spec = podspec.mapping(obj.get("spec"))
        pool = podspec.mapping(spec.get("pool"))
        generation = podspec.whole_number(pool.get("generation")) or 0
        found = slice_devices(obj)
        if not found:
            continue
        key = (found[0].driver, found[0].pool)
        newest[key] = max(newest.get(key, 0), generation)
        decoded.append((generation, found))
    result: dict[tuple[str, str, str], Device] = {}
    for generation, found in decoded:
        if generation == newest[(found[0].driver, found[0].pool)]:
            for device in found:
                result[device.key] = device
    return result


def is_hold_claim(obj: Mapping[str, Any], *, namespace: str = reservations.LEDGER_NAMESPACE) -> bool:
    """Whether a ResourceClaim is one of the extender's hold claims: labelled RULE_LABEL and in the
    ledger namespace `namespace` (where tenants cannot write). The label alone counts for nothing: a
    tenant's claim that carries it is a tenant's claim."""
    metadata = podspec.mapping(obj.get("metadata"))
    return metadata.get("namespace") == namespace and podspec.mapping(metadata.get("labels")).get(RULE_LABEL) == "true"


def holds(
    slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]], *, namespace: str = reservations.LEDGER_NAMESPACE
) -> dict[str, dict[str, tuple[Held, ...]]]:
    """Which cards DRA claims hold: node name -> card UUID -> the claims' results on it. Results with
    admin access hold nothing; results naming a device no slice publishes, or one without a UUID,
    cannot be matched to a card and are left out (`unmatched` lists them). The extender's own hold
    claims (`is_hold_claim`, ledger namespace `namespace`) hold for shared pods, not for DRA: they
    are left out too."""
    published = devices(slices)
    found: dict[str, dict[str, list[Held]]] = {}
    for claim in claims:
        if is_hold_claim(claim, namespace=namespace):
            continue
        for held in claim_results(claim):
            device = published.get(held.key)
            if held.admin_access or device is None or not device.card_uuid:
                continue
            found.setdefault(device.node, {}).setdefault(device.card_uuid, []).append(held)
    return {
        node: {uuid: tuple(sorted(h, key=lambda x: (x.claim_key, x.device))) for uuid, h in cards.items()}
        for node, cards in found.items()
    }


def unmatched(
    slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]], *, namespace: str = reservations.LEDGER_NAMESPACE
) -> tuple[Held, ...]:
    """Allocated results (not admin access) whose device no current slice publishes with a UUID (the
    extender's hold claims left out)."""
    published = devices(slices)
    return tuple(
        held
        for claim in claims
        if not is_hold_claim(claim, namespace=namespace)
        for held in claim_results(claim)
        if not held.admin_access and ((device := published.get(held.key)) is None or not device.card_uuid)
    )


def unmatched_json(found: Iterable[Held]) -> list[dict[str, Any]]:
    """`unmatched` as inspect's JSON lists it (`draUnmatched`)."""
    return [{"claim": h.claim_key, "driver": h.driver, "pool": h.pool, "device": h.device, "shared": h.shared} for h in found]


def unmatched_text(found: Sequence[Held]) -> str:
    """`unmatched` as inspect's text views end with it; "" when there is none."""
    if not found:
        return ""
    lines = ["", "DRA claims on a device no ResourceSlice publishes with a UUID (not matched to any card, so not shown on one):"]
    lines.extend(
        f"  {h.claim_key}: device {h.device} of driver {h.driver}, pool {h.pool}{' (a share)' if h.shared else ''}" for h in found
    )
    return "\n".join(lines) + "\n"


def card_devices(slices: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, tuple[Device, ...]]]:
    """The devices published for each card: node name -> card UUID -> its devices (the whole GPU and
    its MIG devices). The extender's taint rules name these."""
    found: dict[str, dict[str, list[Device]]] = {}
    for device in devices(slices).values():
        if device.card_uuid:
            found.setdefault(device.node, {}).setdefault(device.card_uuid, []).append(device)
    return {node: {uuid: tuple(sorted(d, key=lambda x: x.key)) for uuid, d in cards.items()} for node, cards in found.items()}


# --- taint rules ----------------------------------------------------------------------------------


def rule_name(device: Device) -> str:
    """The extender's DeviceTaintRule name for a device: stable, a valid DNS subdomain."""
    digest = hashlib.sha256("/".join(device.key).encode()).hexdigest()[:16]
    return f"gpu-admission-{digest}"


def taint_rule(device: Device, *, version: str) -> dict[str, Any]:
    """The DeviceTaintRule that keeps `device` from new DRA allocations while the card holds shared
    pods (`NoSchedule`: claims already allocated keep running)."""
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule_name(device),
            "labels": {RULE_LABEL: "true"},
            "annotations": {RULE_NODE_ANNOTATION: device.node, RULE_CARD_ANNOTATION: device.card_uuid},
        },
        "spec": {
            "deviceSelector": {"driver": device.driver, "pool": device.pool, "device": device.name},
            "taint": {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"},
        },
    }


def rule_device(obj: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """The (driver, pool, device) one of our taint rules names; None for a rule that is not ours."""
    metadata = podspec.mapping(obj.get("metadata"))
    if podspec.mapping(metadata.get("labels")).get(RULE_LABEL) != "true":
        return None
    selector = podspec.mapping(podspec.mapping(obj.get("spec")).get("deviceSelector"))
    parts = tuple(selector.get(k) for k in ("driver", "pool", "device"))
    if not all(isinstance(p, str) and p for p in parts):
        return None
    return (str(parts[0]), str(parts[1]), str(parts[2]))


def devices_to_taint(
    published: Mapping[str, Mapping[str, Sequence[Device]]], busy: Mapping[str, Iterable[str]]
) -> tuple[Device, ...]:
    """The devices the extender's rules must keep from DRA: every device published for a card
    (`card_devices`: the whole GPU and its MIG devices) of the cards in `busy` (node -> UUIDs of
    cards that hold shared pods)."""
    found: list[Device] = []
    for node, uuids in busy.items():
        on_node = published.get(node, {})
        for uuid in uuids:
            found.extend(on_node.get(uuid, ()))
    return tuple(sorted(found, key=lambda d: d.key))


def plan_rules(wanted: Iterable[Device], existing: Iterable[Mapping[str, Any]]) -> tuple[tuple[Device, ...], tuple[str, ...]]:
    """What the leader must do: the devices that need a rule, and the names of our rules to delete
    (a device no longer wanted)."""
    by_name = {rule_name(d): d for d in wanted}
    have: set[str] = set()
    stale: list[str] = []
    for rule in existing:
        if rule_device(rule) is None:
            continue
        name = str(podspec.mapping(rule.get("metadata")).get("name", ""))
        if name in by_name:
            have.add(name)
        else:
            stale.append(name)
    return tuple(d for n, d in sorted(by_name.items()) if n not in have), tuple(sorted(stale))


# --- hold claims (where no DeviceTaintRule API is served) ---------------------------------------


def hold_claim(device: Device, *, namespace: str) -> dict[str, Any]:
    """The extender's hold claim for `device` (no status: `hold_allocation` is written to its status
    after the create, since `status` is a subresource). It is reserved for no one: kube-controller-
    manager's resourceclaim controller deallocates a claim only when its last `reservedFor` entry
    goes, and refuses entries that are not pods (docs/dra.md has the source)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {
            "name": rule_name(device),
            "namespace": namespace,
            "labels": {RULE_LABEL: "true"},
            "annotations": {
                RULE_NODE_ANNOTATION: device.node,
                RULE_CARD_ANNOTATION: device.card_uuid,
                HOLD_DEVICE_ANNOTATION: "/".join(device.key),
            },
        },
        "spec": {
            "devices": {
                "requests": [
                    {"name": HOLD_REQUEST, "exactly": {"deviceClassName": HOLD_CLASS, "allocationMode": "ExactCount", "count": 1}}
                ]
            }
        },
    }


def hold_allocation(device: Device) -> dict[str, Any]:
    """The `status.allocation` of a hold claim: the one device, for the claim's one request (the
    apiserver checks the request name; it never checks the device against other claims)."""
    return {
        "devices": {"results": [{"request": HOLD_REQUEST, "driver": device.driver, "pool": device.pool, "device": device.name}]}
    }


def hold_device(obj: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """The (driver, pool, device) one of our hold claims is allocated; None for a claim that is not
    ours (no RULE_LABEL) or not (or no longer) allocated."""
    if podspec.mapping(podspec.mapping(obj.get("metadata")).get("labels")).get(RULE_LABEL) != "true":
        return None
    results = claim_results(obj)
    return results[0].key if len(results) == 1 else None


def plan_holds(
    wanted: Iterable[Device], existing: Iterable[Mapping[str, Any]]
) -> tuple[tuple[Device, ...], tuple[Device, ...], tuple[str, ...]]:
    """What the leader must do with its hold claims: the devices that need a claim created, those
    whose claim exists but is not allocated yet (a create whose status write failed), and the
    names of our claims to release (a device no longer wanted, or a claim allocated another device
    than its name says)."""
    by_name = {rule_name(d): d for d in wanted}
    have: set[str] = set()
    unallocated: list[Device] = []
    stale: list[str] = []
    for claim in existing:
        metadata = podspec.mapping(claim.get("metadata"))
        if podspec.mapping(metadata.get("labels")).get(RULE_LABEL) != "true":
            continue
        name = str(metadata.get("name", ""))
        device = by_name.get(name)
        held = hold_device(claim)
        if device is not None and held is None and not claim_results(claim):
            have.add(name)
            unallocated.append(device)
        elif device is not None and held == device.key:
            have.add(name)
        else:
            stale.append(name)
    create = tuple(sorted((d for n, d in by_name.items() if n not in have), key=lambda d: d.key))
    return create, tuple(sorted(unallocated, key=lambda d: d.key)), tuple(sorted(stale))


# --- claims as admission reads them ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Request:
    """One device request of a claim (or one alternative of a `firstAvailable` request)."""

    name: str
    class_name: str
    selectors: tuple[str, ...] = ()  # CEL expressions
    admin_access: bool = False


def claim_spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ResourceClaimSpec of a ResourceClaim (`spec`) or a ResourceClaimTemplate (`spec.spec`)."""
    spec = podspec.mapping(obj.get("spec"))
    return podspec.mapping(spec.get("spec")) if obj.get("kind") == "ResourceClaimTemplate" else spec


def requests(spec: Mapping[str, Any]) -> tuple[Request, ...]:
    """Every device request of a ResourceClaimSpec, `exactly` and each `firstAvailable` alternative
    (and the v1beta1 shape, with the class directly on the request)."""
    found: list[Request] = []
    for item in podspec.sequence(podspec.mapping(spec.get("devices")).get("requests")):
        item = podspec.mapping(item)
        name = str(item.get("name") or "")
        exact = podspec.mapping(item.get("exactly"))
        alternatives = [podspec.mapping(a) for a in podspec.sequence(item.get("firstAvailable"))]
        bodies = ([exact] if exact else []) + alternatives or [item]
        for body in bodies:
            sub = str(body.get("name") or "")
            found.append(
                Request(
                    name=f"{name}/{sub}" if sub and body is not exact else name,
                    class_name=str(body.get("deviceClassName") or ""),
                    selectors=tuple(
                        str(expr)
                        for selector in podspec.sequence(body.get("selectors"))
                        if isinstance(expr := podspec.mapping(podspec.mapping(selector).get("cel")).get("expression"), str)
                    ),
                    admin_access=body.get("adminAccess") is True,
                )
            )
    return tuple(found)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PodClaim:
    """One entry of a pod's `spec.resourceClaims`: a claim by name, or one made from a template."""

    name: str
    claim_name: str = ""
    template_name: str = ""


def pod_claims(spec: Mapping[str, Any]) -> tuple[PodClaim, ...]:
    """The claims a pod spec references."""
    found: list[PodClaim] = []
    for item in podspec.sequence(spec.get("resourceClaims")):
        item = podspec.mapping(item)
        claim, template = item.get("resourceClaimName"), item.get("resourceClaimTemplateName")
        found.append(
            PodClaim(
                name=str(item.get("name") or ""),
                claim_name=claim if isinstance(claim, str) else "",
                template_name=template if isinstance(template, str) else "",
            )
        )
    return tuple(found)


_WORD = re.compile(r"[a-z0-9]+")


def selector_reaches(expression: str, *, drivers: Sequence[str]) -> bool:
    """Whether a CEL selector may pick a device of one of `drivers` (GPU drivers), read
    conservatively: True when it names any word of a driver's domain other than its top-level
    domain (`nvidia`, `gpu`: in a string, an attribute's domain, any case, split or joined), or
    reads the driver or an attribute's domain in any other way than comparing `device.driver` with
    `==` to one literal. A selector that cannot be proven to stay off GPU drivers reaches them."""
    lowered = expression.lower()
    words = set(_WORD.findall(lowered))
    for driver in drivers:
        parts = [p for p in _WORD.findall(driver.lower()) if p not in {"com", "io", "org", "net", "k8s", "x"}]
        if any(part in words or part in lowered for part in parts):
            return True
    # Anything but `device.driver == '<literal>'` that inspects the driver could be spelled to match one.
    stripped = re.sub(r"device\.driver\s*==\s*(['\"])[^'\"]*\1(?=\s*(&&|\|\||\)|$))", "", expression.strip())
    if "driver" in stripped:
        return True
    # An attribute map iterated or indexed by something but a literal can reach any domain.
    if re.search(r"device\.(attributes|capacity)\s*(\.|\[\s*[^'\"\s])", expression):
        return True
    return False
