"""A namespace's GPU-budget usage from listed cluster objects, for the readers that list them whole.

`policies.gpu.budgets.usage` counts what it is handed; this gathers the hand-over from the objects a
reader lists (the audit, `explain`): the namespace's pods, its budget ledger Lease (in the ledger
namespace, `budgets.lease_namespace`; a Lease anywhere else is never trusted), its allocated DRA
claims (the extender's own hold claims in the ledger namespace hold for shared pods and are left
out, as `dra.holds` leaves them) and the ResourceSlices' device memory.

A ledger entry whose pod is not among the listed pods counts as gone: the pods are listed after the
Leases, and the extender writes an entry only for a pod that exists, so an entry without its pod is
of a pod deleted since (the extender prunes it). Callers that cannot list every pod of the
namespace pass `complete=False`, and then no entry is taken for gone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from policies import podspec
from policies.gpu import budgets, dra, reservations


@dataclasses.dataclass(frozen=True, kw_only=True)
class Listed:
    """What a reader listed that budgets are computed from, indexed once for every namespace."""

    ledgers: Mapping[str, Mapping[str, Any]]  # each budgeted namespace's ledger Lease, by namespace
    claims: Mapping[str, tuple[tuple[str, str, tuple[dra.Held, ...]], ...]]  # namespace -> (uid, name, results)
    device_mib: Mapping[tuple[str, str, str], int]  # each published device's memory
    nodes: Mapping[str, Mapping[str, Any]]  # every node by name
    home: str = reservations.LEDGER_NAMESPACE


def listed(
    *,
    nodes: Iterable[Mapping[str, Any]],
    leases: Iterable[Mapping[str, Any]] = (),
    claims: Iterable[Mapping[str, Any]] = (),
    slices: Iterable[Mapping[str, Any]] = (),
    home: str = reservations.LEDGER_NAMESPACE,
) -> Listed:
    """Index the listed objects (Leases and claims of any kind: those that are no ledger, no
    allocated ResourceClaim or the extender's hold claims are left out)."""
    ledgers: dict[str, Mapping[str, Any]] = {}
    for lease in leases:
        namespace = budgets.lease_namespace(lease, home=home)
        if namespace is not None:
            ledgers[namespace] = lease
    found: dict[str, list[tuple[str, str, tuple[dra.Held, ...]]]] = {}
    for claim in claims:
        if claim.get("kind", "ResourceClaim") != "ResourceClaim" or dra.is_hold_claim(claim, namespace=home):
            continue
        results = dra.claim_results(claim)
        metadata = podspec.mapping(claim.get("metadata"))
        if results:
            found.setdefault(str(metadata.get("namespace") or ""), []).append(
                (str(metadata.get("uid") or ""), str(metadata.get("name") or ""), results)
            )
    by_name = {str(podspec.mapping(node.get("metadata")).get("name", "")): node for node in nodes}
    return Listed(
        ledgers=ledgers,
        claims={namespace: tuple(items) for namespace, items in found.items()},
        device_mib=budgets.device_memory(slices),
        nodes=by_name,
        home=home,
    )


def namespace_usage(
    namespace: str, pods: Iterable[Mapping[str, Any]], objects: Listed, *, now: float, complete: bool = True
) -> budgets.Usage:
    """The namespace's usage: `pods` are its pods (every one of them where `complete`)."""
    pods = list(pods)
    ledger = budgets.lease_ledger(objects.ledgers.get(namespace), home=objects.home)
    seen = {str(podspec.mapping(pod.get("metadata")).get("uid", "")) for pod in pods}
    gone = {uid for uid in ledger if uid not in seen} if complete else set()
    return budgets.usage(
        pods,
        ledger,
        nodes=objects.nodes,
        claims=[(uid, results) for uid, _, results in objects.claims.get(namespace, ())],
        device_mib=objects.device_mib,
        gone=gone,
        now=now,
    )
