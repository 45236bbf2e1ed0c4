"""What cluster data a request needs fetched before the engine judges it (the engine never waits on I/O).

A caller with cluster access (the webhook) asks these pure functions what to read, reads it, and
hands it in on `model.Request` (`env_lookup`, `node_labels`); offline callers skip them and the
policies fall back to what the object alone shows. A superset is harmless: what is not asked for
is not read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies import envsources, model, podspec, trustzone
from policies.gpu import dra


def env_sources(obj: Mapping[str, Any], *, namespace: str) -> frozenset[model.EnvSource]:
    """The ConfigMaps and Secrets GPU001 reads for `obj` (pod or workload template).

    Only `envFrom` without a prefix is looked up: GPU001 judges everything else from the spec alone.
    """
    found: set[model.EnvSource] = set()
    for container in podspec.containers(obj):
        # A container whose env sets every guarded name needs no read either, but none does: the
        # superset saves walking env on the hot path.
        for source in podspec.sequence(container.container.get("envFrom")):
            source = podspec.mapping(source)
            prefix = source.get("prefix")
            if isinstance(prefix, str) and prefix:
                continue
            ref = envsources.referenced(source)
            if ref is not None:
                found.add(model.EnvSource(kind=ref[0], namespace=namespace, name=ref[1]))
    return frozenset(found)


def node_to_look_up(
    obj: Mapping[str, Any] | None, *, old_object: Mapping[str, Any] | None, subresource: str, operation: str = ""
) -> str:
    """The Node whose labels the trust zone needs for this request (`Request.node_labels`), or "" when it needs none.

    Two requests need them, so ordinary reviews cost nothing more than this check:
    - an ephemeralcontainers update that adds a container with a privilege GPU nodes do not allow
      to a bound pod (GPU009);
    - a pod CREATE that names its node (`spec.nodeName`) and has node power (GPU002, GPU003: a pod
      that names a GPU node is judged as one that can reach it, and `kubectl debug node/...` is
      such a pod).
    Node power is judged by the built-in allowances, which a namespace's only widen: a superset.
    """
    if obj is None:
        return ""
    found = podspec.template(obj)
    if found is None or not found.is_pod:
        return ""
    node = found.spec.get("nodeName")
    if not isinstance(node, str) or not node:
        return ""
    if subresource == "" and operation == "CREATE":
        return node if trustzone.has_node_power(found.spec) else ""
    if subresource != podspec.EPHEMERAL_SUBRESOURCE:
        return ""
    added = podspec.new_ephemeral_containers(obj, old_object=old_object)
    shared = trustzone.shared_namespaces(found.spec)
    powered = any(
        next(trustzone.container_power(ref, trustzone.DEFAULT_ALLOWANCE, shared=shared), None) is not None for ref in added
    )
    return node if powered else ""


def claims_to_look_up(obj: Mapping[str, Any] | None) -> frozenset[tuple[str, str]]:
    """The DRA ResourceClaims and ResourceClaimTemplates (kind, name) a pod or workload template
    names in `spec.resourceClaims`, for GPU011 (`Request.claims`); none for other objects."""
    if obj is None:
        return frozenset()
    found = podspec.template(obj)
    if found is None:
        return frozenset()
    wanted: set[tuple[str, str]] = set()
    for ref in dra.pod_claims(found.spec):
        if ref.claim_name:
            wanted.add(("ResourceClaim", ref.claim_name))
        if ref.template_name:
            wanted.add(("ResourceClaimTemplate", ref.template_name))
    return frozenset(wanted)
