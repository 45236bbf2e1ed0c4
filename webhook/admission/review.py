"""The AdmissionReview v1 wire format, and parsing a request body into a checked ``Review``.

A body that is not a well-formed review raises ``BadReview``; the handlers answer it with HTTP 400
(the apiserver's error channel), never with a verdict.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, Literal, NotRequired, Required, TypedDict, TypeVar

from webhook.admission import jsoncodec

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")

# Pods and workloads nest about 15-25 levels deep in a review (managedFields included); 100 leaves
# room while keeping every recursive walk over the object far from Python's recursion limit.
MAX_DEPTH = 100

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]

_T = TypeVar("_T")


class GroupVersionKind(TypedDict):
    group: str
    version: str
    kind: str


class UserInfo(TypedDict, total=False):
    username: str
    uid: str
    groups: list[str]
    extra: dict[str, list[str]]


class AdmissionRequest(TypedDict, total=False):
    uid: Required[str]
    kind: GroupVersionKind
    resource: dict[str, str]
    subResource: str
    requestKind: GroupVersionKind
    name: str
    namespace: str
    operation: Required[Operation]
    userInfo: UserInfo
    object: dict[str, Any] | None
    oldObject: dict[str, Any] | None
    dryRun: bool
    options: dict[str, Any] | None


class AdmissionReviewRequest(TypedDict):
    apiVersion: str
    kind: str
    request: AdmissionRequest


class Status(TypedDict, total=False):
    code: int
    message: str


class AdmissionResponse(TypedDict):
    uid: str
    allowed: bool
    status: NotRequired[Status]
    patchType: NotRequired[Literal["JSONPatch"]]
    patch: NotRequired[str]
    warnings: NotRequired[list[str]]
    auditAnnotations: NotRequired[dict[str, str]]


class AdmissionReviewResponse(TypedDict):
    apiVersion: str
    kind: str
    response: AdmissionResponse


class BadReview(ValueError):
    """The body is not a well-formed AdmissionReview v1; the message is the short reason."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Review:
    """A checked AdmissionReview request, reduced to what the handlers use."""

    api_version: str
    kind: str
    uid: str
    operation: Operation
    object: Mapping[str, Any] | None
    old_object: Mapping[str, Any] | None
    namespace: str
    name: str
    object_kind: str
    subresource: str
    user: str
    groups: tuple[str, ...]
    dry_run: bool


def parse(body: bytes) -> Review:
    """Parse and check a request body; raise ``BadReview`` with a short reason if it is not a review."""
    if _too_deep(body):
        raise BadReview(f"body nests deeper than {MAX_DEPTH} levels")
    try:
        data = jsoncodec.loads(body, fallback=_standard_loads)
    except RecursionError as error:
        # Unbalanced brackets slip past the depth scan; the decoder then recurses until it stops.
        raise BadReview(f"body nests deeper than {MAX_DEPTH} levels") from error
    except (ValueError, UnicodeDecodeError) as error:
        raise BadReview(f"body is not JSON: {_first_line(error)}") from error
    return check(data)


def check(data: object) -> Review:
    """Check an already-decoded body; see ``parse``."""
    if not isinstance(data, dict):
        raise BadReview(f"body must be a JSON object, not {_json_type(data)}")
    if data.get("apiVersion") != API_VERSION:
        raise BadReview(f"apiVersion must be {API_VERSION}, not {_short(data.get('apiVersion'))}")
    if data.get("kind") != KIND:
        raise BadReview(f"kind must be {KIND}, not {_short(data.get('kind'))}")
    request = data.get("request")
    if not isinstance(request, dict):
        raise BadReview("review has no request object" if request is None else "request must be an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("request.uid must be a non-empty string")
    operation = request.get("operation")
    if operation not in OPERATIONS:
        raise BadReview(f"request.operation must be one of {', '.join(OPERATIONS)}, not {_short(operation)}")
    user_info = _optional(request, "userInfo", dict, {})
    groups = _optional(user_info, "groups", list, [], where="request.userInfo")
    if not all(isinstance(group, str) for group in groups):
        raise BadReview("request.userInfo.groups must be a list of strings")
    kind = _optional(request, "kind", dict, {})
    object_kind = _optional(kind, "kind", str, "", where="request.kind")
    obj = _optional_object(request, "object")
    if obj is not None and "kind" in obj and not isinstance(obj["kind"], str):
        raise BadReview("request.object.kind must be a string")
    return Review(
        api_version=API_VERSION,
        kind=KIND,
        uid=uid,
        operation=operation,
        object=obj,
        old_object=_optional_object(request, "oldObject"),
        namespace=_optional(request, "namespace", str, ""),
        name=_optional(request, "name", str, ""),
        object_kind=object_kind,
        subresource=_optional(request, "subResource", str, ""),
        user=_optional(user_info, "username", str, "", where="request.userInfo"),
        groups=tuple(groups),
        dry_run=_optional(request, "dryRun", bool, False),
    )


def _optional(container: Mapping[str, Any], key: str, expected: type[_T], default: _T, *, where: str = "request") -> _T:
    value = container.get(key)
    if value is None:
        return default
    if not isinstance(value, expected) or (expected is not bool and isinstance(value, bool)):
        raise BadReview(f"{where}.{key} must be {_type_name(expected)}, not {_json_type(value)}")
    return value


def _optional_object(request: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    value = request.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadReview(f"request.{key} must be an object or null, not {_json_type(value)}")
    return value


_KEEP_QUOTES_AND_BRACKETS = bytes(b for b in range(256) if b not in b'"[]{}')
_AS_PARENS = bytes.maketrans(b"[]{}", b"()()")


def _too_deep(body: bytes) -> bool:
    """Whether the bracket nesting passes ``MAX_DEPTH``, without recursing.

    Brackets inside JSON strings do not nest, so strings go first: escaped backslashes, then
    escaped quotes are removed (left to right, so ``\\\\"`` keeps its closing quote); after that
    every remaining quote delimits a string, and keeping only quotes and brackets turns each
    string into ``"…"`` whose inside a split on the quote drops. Each pass after that deletes
    every innermost ``()`` pair, lowering the depth by one, so a balanced body is at most
    ``MAX_DEPTH`` deep exactly when it is empty after ``MAX_DEPTH`` passes. Every step runs at C
    speed over the body once, which keeps the check cheap even for a body at the size limit.
    """
    if body.count(b"{") + body.count(b"[") <= MAX_DEPTH:
        return False  # cannot nest deeper than it has openings: most pod reviews stop here
    skeleton = body.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _KEEP_QUOTES_AND_BRACKETS)
    brackets = b"".join(skeleton.split(b'"')[::2]).translate(_AS_PARENS)
    for _ in range(MAX_DEPTH):
        if not brackets:
            return False
        shorter = brackets.replace(b"()", b"")
        if len(shorter) == len(brackets):
            return False  # unbalanced: json.loads reports it (or recurses; see parse)
        brackets = shorter
    return bool(brackets)


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _standard_loads(body: bytes) -> Any:
    # json.loads(body, parse_constant=...) without building a decoder per request
    return _DECODER.decode(body.decode(json.detect_encoding(body), "surrogatepass"))


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _type_name(expected: type) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(expected, expected.__name__)


def _short(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _first_line(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__
