"""An object less what its replicas differ in: the shared part of the webhook's and the audit's keys.

A Deployment's pods, a Job's completions and a DaemonSet's pods are copies of one template. The
webhook's decision cache (``webhook.admission.decisioncache``) and the audit's verdict memo
(``webhook.audit.verdicts``) each remember a result by a digest of the object less the fields a
controller or the API server sets differently on each copy, so that the next copy is a hit. This
module is that common part; each side adds its own inputs to the key (the webhook: operation,
namespace labels, user, groups, dryRun, looked-up data; the audit: its handling of ``status``).

**Left out** (``replica_form``):

- ``VOLATILE_METADATA``: name, generateName, uid, creationTimestamp, resourceVersion,
  managedFields. No built-in policy reads them; a pod's name reaches a verdict only through a
  settings exception's ``names``, so with ``keeps_names`` name and generateName stay in.
- the random name of the ServiceAccount token volume: kube-apiserver's ServiceAccount admission
  plugin gives every pod a projected volume ``kube-api-access-<5 random characters>`` mounted in
  each container. Where a Pod has exactly one such volume, it and its mounts are renamed
  ``TOKEN_VOLUME`` (``kube-api-access-*``: no real volume can be named so).

Everything else stays, in the object's own key order: equal dumps mean equal objects, and the
same object with its keys in another order is only a miss, never a wrong answer. What is left out
is returned too: a result that names one of those values is right for that object only, and the
callers do not keep it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any

VOLATILE_METADATA = frozenset({"name", "generateName", "uid", "creationTimestamp", "resourceVersion", "managedFields"})
NAMES = frozenset({"name", "generateName"})
IDENTITY_FIELDS = ("name", "generateName", "uid")  # the metadata whose values a result may quote
TOKEN_VOLUME_PREFIX = "kube-api-access-"
TOKEN_VOLUME = TOKEN_VOLUME_PREFIX + "*"
DIGEST_SIZE = 16  # bytes: 128 bits


@dataclasses.dataclass(frozen=True)
class ReplicaForm:
    """``replica_form``'s answer: the object less what replicas differ in, and what was taken out."""

    object: Mapping[str, Any]
    dropped: tuple[str, ...]  # the non-empty string values of the identity fields left out (name, generateName, uid)
    token_volume: str | None  # the token volume's own name, where it was renamed

    @property
    def volatile(self) -> list[str]:
        """Every value left out of the form: a result naming one of them fits this object only."""
        return [*self.dropped, *([self.token_volume] if self.token_volume is not None else [])]


def replica_form(obj: Mapping[str, Any], *, keeps_names: bool) -> ReplicaForm:
    """``obj`` less ``VOLATILE_METADATA`` (name and generateName kept with ``keeps_names``) and with
    its token volume renamed (see the module docstring). ``obj`` itself is not changed; parts not
    changed are shared with it."""
    dropped: list[str] = []
    metadata = obj.get("metadata")
    if isinstance(metadata, Mapping):
        left_out = VOLATILE_METADATA - NAMES if keeps_names else VOLATILE_METADATA
        dropped = [v for f in IDENTITY_FIELDS if f in left_out and isinstance(v := metadata.get(f), str) and v]
        obj = {**obj, "metadata": {k: v for k, v in metadata.items() if k not in left_out}}
    renamed, token = token_volume_renamed(obj)
    return ReplicaForm(object=renamed, dropped=tuple(dropped), token_volume=token)


def token_volume_name(obj: Mapping[str, Any]) -> str | None:
    """The name of ``obj``'s one ServiceAccount token volume (a projected volume named
    ``TOKEN_VOLUME_PREFIX``...); None where ``obj`` is no Pod with a volume list or has not exactly one."""
    spec = obj.get("spec") if obj.get("kind") == "Pod" else None
    volumes = spec.get("volumes") if isinstance(spec, Mapping) else None
    if not isinstance(volumes, list):
        return None
    tokens = [
        v["name"]
        for v in volumes
        if isinstance(v, Mapping)
        and "projected" in v
        and isinstance(v.get("name"), str)
        and v["name"].startswith(TOKEN_VOLUME_PREFIX)
    ]
    return tokens[0] if len(tokens) == 1 else None


def token_volume_renamed(obj: Mapping[str, Any]) -> tuple[Mapping[str, Any], str | None]:
    """``obj`` with its one ServiceAccount token volume (and the mounts of it) named ``TOKEN_VOLUME``,
    and the name it had; ``obj`` itself and None where it is no Pod or has not exactly one."""
    token = token_volume_name(obj)
    if token is None:
        return obj, None
    spec: Mapping[str, Any] = obj["spec"]
    volumes: list[Any] = spec["volumes"]
    renamed: dict[str, Any] = {
        **spec,
        "volumes": [{**v, "name": TOKEN_VOLUME} if isinstance(v, Mapping) and v.get("name") == token else v for v in volumes],
    }
    for field in ("containers", "initContainers", "ephemeralContainers"):
        containers = spec.get(field)
        if isinstance(containers, list):
            renamed[field] = [_mounts_renamed(c, token) for c in containers]
    return {**obj, "spec": renamed}, token


def _mounts_renamed(container: Any, token: str) -> Any:
    mounts = container.get("volumeMounts") if isinstance(container, Mapping) else None
    if not isinstance(mounts, list):
        return container
    return {
        **container,
        "volumeMounts": [{**m, "name": TOKEN_VOLUME} if isinstance(m, Mapping) and m.get("name") == token else m for m in mounts],
    }


def digest(dumped: bytes) -> bytes:
    """The 128-bit BLAKE2b digest both keys use, of a key document already dumped to bytes (each
    side dumps with its own codec, so the dump is the caller's)."""
    return hashlib.blake2b(dumped, digest_size=DIGEST_SIZE).digest()
