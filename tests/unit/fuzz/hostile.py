"""Hypothesis strategies for hostile request bodies: generated, mutated, truncated, deep, wrong types.

Shared by the CI fuzz tests beside this file and by ``bench/fuzz_long.py``. Every strategy draws
``(label, body)`` so a status histogram can say which family a failure came from.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

Body = tuple[str, bytes]

# JSON values of every type, nested a little; text includes lone surrogates' neighbours, NULs,
# brackets and quotes, which the depth scan and the decoders must take in their stride.
_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=20) | st.sampled_from(
    ["", "{", "]", '"', "\\", "\x00", "NVIDIA_VISIBLE_DEVICES", "all", "void", "aliyun.com/gpu-mem", "-1", "1e400"]
)
_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXT
)
JSON = st.recursive(
    _LEAVES,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_TEXT, children, max_size=4),
    max_leaves=20,
)

CONTENT_TYPES = st.sampled_from(
    [
        "application/json",
        "application/json; charset=utf-8",
        "application/json; charset=latin-1",
        "application/json; charset=no-such-codec",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=xyz",
        "application/octet-stream",
        "application/yaml",
        "*/*",
        "",
        None,
    ]
)


def pod(*, env: list[Any] | None = None, limits: dict[str, Any] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.example/ml:1"}
    if env is not None:
        container["env"] = env
    container["resources"] = {"limits": limits if limits is not None else {"aliyun.com/gpu-mem": 2}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "fuzz", "namespace": "team-a", "labels": {"app": "fuzz"}},
        "spec": {"containers": [container], "nodeSelector": {"ack.node.gpu.schedule": "cgpu"}},
    }


def review(obj: Any = None, *, uid: str = "fuzz-0001") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "team-a",
            "operation": "CREATE",
            "userInfo": {"username": "fuzz", "groups": ["system:authenticated"]},
            "object": pod() if obj is None else obj,
            "oldObject": None,
            "dryRun": False,
        },
    }


def filter_args(obj: Any = None) -> dict[str, Any]:
    return {"Pod": pod() if obj is None else obj, "Nodes": None, "NodeNames": ["gpu-0", "gpu-1", "missing"]}


def bind_args() -> dict[str, Any]:
    return {"PodName": "fuzz", "PodNamespace": "team-a", "PodUID": "uid-fuzz", "Node": "gpu-0"}


# Paths into a valid document whose value gets replaced by a value of any type.
REVIEW_PATHS: list[tuple[Any, ...]] = [
    (),
    ("apiVersion",),
    ("kind",),
    ("request",),
    ("request", "uid"),
    ("request", "operation"),
    ("request", "namespace"),
    ("request", "userInfo"),
    ("request", "userInfo", "groups"),
    ("request", "kind"),
    ("request", "kind", "kind"),
    ("request", "object"),
    ("request", "oldObject"),
    ("request", "dryRun"),
    ("request", "subResource"),
    ("request", "object", "kind"),
    ("request", "object", "metadata"),
    ("request", "object", "metadata", "namespace"),
    ("request", "object", "metadata", "annotations"),
    ("request", "object", "spec"),
    ("request", "object", "spec", "containers"),
    ("request", "object", "spec", "containers", 0),
    ("request", "object", "spec", "containers", 0, "env"),
    ("request", "object", "spec", "containers", 0, "resources"),
    ("request", "object", "spec", "containers", 0, "resources", "limits"),
    ("request", "object", "spec", "containers", 0, "resources", "limits", "aliyun.com/gpu-mem"),
    ("request", "object", "spec", "containers", 0, "securityContext"),
    ("request", "object", "spec", "nodeSelector"),
    ("request", "object", "spec", "affinity"),
    ("request", "object", "spec", "volumes"),
    ("request", "object", "spec", "initContainers"),
    ("request", "object", "spec", "ephemeralContainers"),
    ("request", "object", "spec", "template"),
]
FILTER_PATHS: list[tuple[Any, ...]] = [
    (),
    ("Pod",),
    ("NodeNames",),
    ("Nodes",),
    ("Pod", "metadata"),
    ("Pod", "metadata", "uid"),
    ("Pod", "spec"),
    ("Pod", "spec", "containers"),
    ("Pod", "spec", "containers", 0),
    ("Pod", "spec", "containers", 0, "resources"),
    ("Pod", "spec", "containers", 0, "resources", "limits"),
    ("Pod", "spec", "containers", 0, "resources", "limits", "aliyun.com/gpu-mem"),
    ("Pod", "metadata", "annotations"),
    ("Pod", "spec", "nodeSelector"),
]
BIND_PATHS: list[tuple[Any, ...]] = [(), ("PodName",), ("PodNamespace",), ("PodUID",), ("Node",)]


def _replace(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    changed = copy.deepcopy(document)
    parent = changed
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    return changed


def _encode(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


@st.composite
def wrong_types(draw: st.DrawFn, make: Callable[[], Any], paths: list[tuple[Any, ...]]) -> Body:
    path = draw(st.sampled_from(paths))
    return f"wrong-type {'/'.join(map(str, path)) or '<root>'}", _encode(_replace(make(), path, draw(JSON)))


@st.composite
def mutated(draw: st.DrawFn, make: Callable[[], Any]) -> Body:
    """A valid body, then byte-level damage: truncated, bytes flipped, inserted, deleted, spliced."""
    data = bytearray(_encode(make()))
    how = draw(st.sampled_from(["truncate", "flip", "insert", "delete", "splice", "repeat"]))
    if how == "truncate":
        return how, bytes(data[: draw(st.integers(0, len(data) - 1))])
    for _ in range(draw(st.integers(1, 8))):
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        if how == "flip":
            data[at] = draw(st.integers(0, 255))
        elif how == "insert":
            data[at:at] = draw(
                st.binary(min_size=1, max_size=8)
                | st.sampled_from([b"{", b"[", b'"', b"\\", b",", b"\xff", b"\xc3", b"\xed\xa0\x80"])
            )
        elif how == "delete":
            del data[at : at + draw(st.integers(1, 16))]
        elif how == "splice":
            other = draw(st.integers(0, len(data) - 1))
            data[at:at] = data[other : other + draw(st.integers(1, 64))]
        else:  # a stretch of the body repeated, which can duplicate keys or whole objects
            data[at:at] = data[at : at + draw(st.integers(1, 40))] * draw(st.integers(2, 20))
    return how, bytes(data)


@st.composite
def structural(draw: st.DrawFn, make: Callable[[], Any]) -> Body:
    """Nesting near and far past the limit, duplicate keys, invalid UTF-8, odd numbers, junk."""
    kind = draw(
        st.sampled_from(
            ["deep", "deep-unbalanced", "deep-in-object", "duplicate-keys", "bad-utf8", "numbers", "binary", "generated", "empty"]
        )
    )
    if kind == "deep":
        depth = draw(st.sampled_from([99, 100, 101, 150, 1000, 5000, 50_000]))
        opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
        return f"deep {depth}", opener * depth + b"1" + closer * depth
    if kind == "deep-unbalanced":
        depth = draw(st.sampled_from([101, 1000, 100_000]))
        return f"deep-unbalanced {depth}", draw(st.sampled_from([b"[", b"{", b'{"a":['])) * depth
    if kind == "deep-in-object":
        depth = draw(st.sampled_from([45, 50, 51, 1000]))  # each level is an object and a list: 2 deep
        nested = '{"n":[' * depth + '"x"' + "]}" * depth
        return f"deep-in-object {2 * depth}", _encode(_deep_into(make(), "@DEEP@")).replace(b'"@DEEP@"', nested.encode())
    if kind == "duplicate-keys":
        text = _encode(make()).decode("utf-8")
        key = draw(
            st.sampled_from(['"apiVersion":', '"kind":', '"request":', '"uid":', '"object":', '"Pod":', '"PodName":', '"spec":'])
        )
        value = json.dumps(draw(JSON))
        return "duplicate-keys", text.replace(key, f"{key}{value},{key}", 1).encode("utf-8")
    if kind == "bad-utf8":
        data = bytearray(_encode(make()))
        at = draw(st.integers(1, len(data) - 2))
        data[at:at] = draw(st.sampled_from([b"\xff", b"\xfe\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80"]))
        return "bad-utf8", bytes(data)
    if kind == "numbers":
        number = draw(
            st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e999999", b"9" * 5000, b"-0", b"1.5e-400", b"0x10", b"01"])
        )
        text = _encode(make()).decode("utf-8")
        return f"numbers {number[:12]!r}", text.replace('"fuzz"', number.decode(), 1).replace(
            "2}", number.decode() + "}", 1
        ).encode()
    if kind == "binary":
        return "binary", draw(st.binary(max_size=512))
    if kind == "generated":
        return "generated", _encode(draw(JSON))
    return "empty", b""


def _deep_into(document: Any, nested: Any) -> Any:
    """``document`` with ``nested`` put under its first object member that is itself an object."""
    changed = copy.deepcopy(document)
    for _key, value in changed.items():
        if isinstance(value, dict):
            value["deep"] = nested
            return changed
    changed["deep"] = nested
    return changed


def admission_bodies() -> st.SearchStrategy[Body]:
    return st.one_of(wrong_types(review, REVIEW_PATHS), mutated(review), structural(review))


def filter_bodies() -> st.SearchStrategy[Body]:
    return st.one_of(wrong_types(filter_args, FILTER_PATHS), mutated(filter_args), structural(filter_args))


def bind_bodies() -> st.SearchStrategy[Body]:
    return st.one_of(wrong_types(bind_args, BIND_PATHS), mutated(bind_args), structural(bind_args))
