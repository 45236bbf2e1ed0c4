"""RFC 6901 JSON pointers and the RFC 6902 `add` operations mutators emit, and applying them.

Mutators only ever add (DESIGN section 2: "only adds what is missing"), so this module builds and
applies `add` operations and nothing else. `apply` lets the engine run mutators one after another on
a working copy, so that each sees the previous ones' output and the joined patch applies in order.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

Operation = Mapping[str, Any]  # {"op": "add", "path": ..., "value": ...}


class PatchError(ValueError):
    """An operation does not fit the document it is applied to."""


def escape(token: str) -> str:
    """One reference token escaped for a JSON pointer: `~` becomes `~0`, `/` becomes `~1`."""
    return token.replace("~", "~0").replace("/", "~1")


def unescape(token: str) -> str:
    """The inverse of `escape`."""
    return token.replace("~1", "/").replace("~0", "~")


def pointer(*tokens: str) -> str:
    """A JSON pointer from raw (unescaped) tokens: pointer("metadata", "a/b") == "/metadata/a~1b"."""
    return "".join("/" + escape(token) for token in tokens)


def join(base: str, *tokens: str) -> str:
    """A JSON pointer under `base` (already a pointer) from raw tokens."""
    return base + pointer(*tokens)


def add(path: str, value: Any) -> Operation:
    """An RFC 6902 `add` operation."""
    return {"op": "add", "path": path, "value": value}


def add_env(container_path: str, container: Mapping[str, Any], entry: Mapping[str, Any]) -> Operation | None:
    """The operation that appends `entry` to a container's `env`, creating the list where there is
    none; None where `env` is not a list (a malformed container is judged, not patched)."""
    env = container.get("env")
    if env is None:
        return add(join(container_path, "env"), [dict(entry)])
    if isinstance(env, list):
        return add(join(container_path, "env", "-"), dict(entry))
    return None


def split(path: str) -> list[str]:
    """The unescaped tokens of a JSON pointer."""
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"not a JSON pointer: {path!r}")
    return [unescape(token) for token in path[1:].split("/")]


# Decoded JSON leaves: never copied, and recognised by exact type without a call (thaw runs over
# every node of a review, managedFields included, so the per-node cost is what matters).
_LEAVES: frozenset[type] = frozenset({str, int, float, bool, type(None)})


def thaw(value: Any) -> Any:
    """A mutable deep copy of decoded JSON: mappings become dicts, lists and tuples lists.

    Leaves (and anything unexpected) are shared, not copied: mutators never modify leaves, and a
    generic deep copy could fail on objects that are not JSON.
    """
    kind = type(value)
    if kind is dict:
        return {key: item if type(item) in _LEAVES else thaw(item) for key, item in value.items()}
    if kind is list or kind is tuple:
        return [item if type(item) in _LEAVES else thaw(item) for item in value]
    if kind in _LEAVES:
        return value
    if isinstance(value, Mapping):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(item) for item in value]
    return value


_ABSENT = object()  # undo marker: the key was not there before
_INSERTED = object()  # undo marker: the list item was inserted


def apply(document: MutableMapping[str, Any], operations: Sequence[Operation]) -> None:
    """Apply `add` operations to a thawed document in place (RFC 6902 semantics for `add`).

    All or nothing: when an operation does not fit, the ones already applied are undone before the
    error propagates, so a caller needs no copy of the document to keep it intact.
    """
    undo: list[tuple[Any, Any, Any]] = []
    try:
        for operation in operations:
            if operation.get("op") != "add":
                raise PatchError(f"only add operations are supported, got {operation.get('op')!r}")
            tokens = split(str(operation["path"]))
            if not tokens:
                raise PatchError("cannot replace the whole document")
            parent: Any = document
            for token in tokens[:-1]:
                parent = _child(parent, token)
            last = tokens[-1]
            value = thaw(operation["value"])
            if isinstance(parent, MutableMapping):
                undo.append((parent, last, parent.get(last, _ABSENT)))
                parent[last] = value
            elif isinstance(parent, list):
                index = len(parent) if last == "-" else _index(last, upper=len(parent))
                parent.insert(index, value)
                undo.append((parent, index, _INSERTED))
            else:
                raise PatchError(f"cannot add under a {type(parent).__name__} at {operation['path']}")
    except Exception:
        for parent, key, previous in reversed(undo):
            if previous is _ABSENT or previous is _INSERTED:
                del parent[key]
            else:
                parent[key] = previous
        raise


def _child(parent: Any, token: str) -> Any:
    if isinstance(parent, Mapping):
        if token not in parent:
            raise PatchError(f"no member {token!r}")
        return parent[token]
    if isinstance(parent, list):
        return parent[_index(token, upper=len(parent) - 1)]
    raise PatchError(f"cannot descend into a {type(parent).__name__}")


def _index(token: str, *, upper: int) -> int:
    if not (token.isascii() and token.isdigit()) or (len(token) > 1 and token.startswith("0")):
        raise PatchError(f"not an array index: {token!r}")
    index = int(token)
    if index > upper:
        raise PatchError(f"array index {index} out of range")
    return index
