"""The keys of ConfigMaps and Secrets that containers read through env (never a value), and the references to them.

GPU007 refuses sources whose keys are guarded GPU environment names, GPU001 judges what a
container's `envFrom` would take from them, and the audit holds many sources at once reduced to
their keys (`keys_only`), so no Secret value is ever held, logged or shown.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from policies import gpu, podspec

SourceKind = Literal["ConfigMap", "Secret"]
SOURCE_KINDS: frozenset[str] = frozenset({"ConfigMap", "Secret"})
# Where each kind keeps its keys (`stringData` is write-only: the apiserver folds it into `data`,
# but a manifest given to dry-run still has it).
_KEY_FIELDS: Mapping[str, tuple[str, ...]] = {
    "ConfigMap": ("data", "binaryData"),
    "Secret": ("data", "stringData"),
}
# The fields of an `envFrom` entry (`configMapRef`, `secretRef`) or of an env `valueFrom`
# (`configMapKeyRef`, `secretKeyRef`) that name a source, with the kind each one names.
REFERENCE_FIELDS: Mapping[str, SourceKind] = {
    "configMapRef": "ConfigMap",
    "secretRef": "Secret",
    "configMapKeyRef": "ConfigMap",
    "secretKeyRef": "Secret",
}
ENV_FROM_FIELDS = ("configMapRef", "secretRef")


def referenced(entry: Mapping[str, Any], *, fields: tuple[str, ...] = ENV_FROM_FIELDS) -> tuple[SourceKind, str] | None:
    """The kind and name of the source an `envFrom` entry (or, with `fields`, a `valueFrom`) names; None if none."""
    for field in fields:
        ref = podspec.mapping(entry.get(field))
        if ref:
            return REFERENCE_FIELDS[field], str(ref.get("name", ""))
    return None


def keys(obj: Mapping[str, Any]) -> frozenset[str]:
    """Every key of a ConfigMap or Secret (never a value); empty for any other object."""
    fields = _KEY_FIELDS.get(str(obj.get("kind")), ())
    return frozenset(key for field in fields for key in podspec.mapping(obj.get(field)) if isinstance(key, str))


def guarded_keys(obj: Mapping[str, Any]) -> tuple[str, ...]:
    """The keys of a ConfigMap or Secret that are guarded names (`gpu.GUARDED_ENV`), sorted; () for any other object."""
    return tuple(sorted(keys(obj) & gpu.GUARDED_ENV))


def keys_only(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A ConfigMap or Secret with every value dropped (each key maps to ""), for holding many of them
    (the audit) without holding a single Secret value."""
    shown: dict[str, Any] = {field: obj[field] for field in ("apiVersion", "kind") if field in obj}
    # Only naming metadata: annotations can hold the whole object again (kubectl's
    # last-applied-configuration carries a Secret's values), managedFields its field names.
    metadata = podspec.mapping(obj.get("metadata"))
    shown["metadata"] = {f: metadata[f] for f in ("name", "generateName", "namespace", "uid") if f in metadata}
    for field in _KEY_FIELDS.get(str(obj.get("kind")), ()):
        values = obj.get(field)
        if isinstance(values, Mapping):
            shown[field] = dict.fromkeys((k for k in values if isinstance(k, str)), "")
    return shown
