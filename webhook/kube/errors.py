"""The cluster errors of the whole package, and the one function that makes them from the client's failures.

Every call to the apiserver fails as a `KubeError`: ``str()`` is one line saying what was being
done and why (``cannot read lease gpu-admission/x: 503 Service Unavailable: etcdserver: leader
changed``), ``status`` is the HTTP status (0: no answer came). The subclasses are the answers code
acts on; `webhook.kube.retry` decides from them what may be tried again:

=================  ======  =================================================  ======================
type               status  meaning                                            retried
=================  ======  =================================================  ======================
`NotFound`         404     the object does not exist                          never
`Conflict`         409     a precondition (resourceVersion, UID) failed, or   never: read again and
                           the object exists already                          decide again
`Gone`             410     the resourceVersion is too old (watch, paged list) never: list again
`TooManyRequests`  429     refused before it ran (flow control); carries      every call
                           ``retry_after_s`` when the server sent Retry-After
`ServerError`      5xx     the apiserver or etcd failed                       idempotent calls only
`Unreachable`      0       no answer: refused, reset, TLS, timeout            idempotent calls only
=================  ======  =================================================  ======================

Any other status (400, 401, 403, 422, ...) is a plain `KubeError`, never retried.

`translate` is the only place that looks inside the `kubernetes` client's ``ApiException``, its
transport errors (urllib3, OSError) and the raw answers of ``ApiClient.call_api`` (`Answer`, for
the extender, which reads JSON without the client's models). It imports nothing heavy: a failure
can only be the client's if the client is already loaded.
"""

from __future__ import annotations

import dataclasses
import http
import json
import re
import sys
from collections.abc import Mapping
from typing import Any, ClassVar


class KubeError(Exception):
    """A cluster call failed. ``str()`` is one line; ``status`` the HTTP status, 0 without an answer."""

    default_status: ClassVar[int] = 0

    def __init__(self, message: str, *, status: int | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status: int = self.default_status if status is None else status
        self.retry_after_s: float | None = retry_after_s

    @property
    def reason(self) -> str:
        """The one-line message."""
        return first_line(self)


class NotFound(KubeError):
    """404: the object does not exist."""

    default_status = 404


class Conflict(KubeError):
    """409: someone else wrote first (a resourceVersion or UID precondition failed, or it exists already)."""

    default_status = 409


class Gone(KubeError):
    """410: the resourceVersion is too old for the watch or the list page; list again."""

    default_status = 410


class TooManyRequests(KubeError):
    """429: the apiserver refused the request before running it; ``retry_after_s`` says when to come back."""

    default_status = 429


class ServerError(KubeError):
    """5xx: the apiserver (or etcd behind it) failed; the request may or may not have taken effect."""

    default_status = 500


class Unreachable(KubeError):
    """No answer: connection refused or reset, TLS failure, timeout. The request may have arrived."""

    default_status = 0


_BY_STATUS: dict[int, type[KubeError]] = {404: NotFound, 409: Conflict, 410: Gone, 429: TooManyRequests}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Answer:
    """An answer with an error status as a raw client call returns it (``ApiClient.call_api``)."""

    status: int
    body: bytes | str = b""
    reason: str = ""
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)


def translate(failure: BaseException | Answer, *, what: str) -> KubeError:
    """The `KubeError` for a failed call: ``what`` was being done (``cannot read secret ns/x``), and
    ``failure`` is the client's ``ApiException``, a transport error, an `Answer`, or anything else
    raised while calling (a plain `KubeError` then). A `KubeError` is returned unchanged."""
    if isinstance(failure, KubeError):
        return failure
    if isinstance(failure, Answer):
        return _of_answer(failure.status, reason=failure.reason, body=failure.body, headers=failure.headers, what=what)
    if _is_api_exception(failure):
        error: Any = failure  # the client's exception is untyped: Any stops here
        status = error.status if isinstance(error.status, int) else 0
        if status:
            headers = error.headers if isinstance(error.headers, Mapping) else {}
            return _of_answer(status, reason=str(error.reason or ""), body=error.body, headers=headers, what=what)
        # status 0: the client's own failure before any answer (an SSL error, a bad request body)
        return Unreachable(f"{what}: {_one_line(str(error.reason or '')) or type(failure).__name__}")
    if is_transport(failure):
        return Unreachable(f"{what}: {_transport_reason(failure)}")
    return KubeError(f"{what}: {first_line(failure)}")


def recognised(failure: BaseException) -> bool:
    """Whether ``failure`` is one `translate` knows: a `KubeError`, the client's ``ApiException``, a transport error."""
    return isinstance(failure, KubeError) or _is_api_exception(failure) or is_transport(failure)


def is_transport(failure: BaseException) -> bool:
    """No answer came: an OSError (refused, reset, timeout, TLS) or a urllib3 error."""
    if isinstance(failure, OSError):
        return True
    exceptions = sys.modules.get("urllib3.exceptions")
    return exceptions is not None and isinstance(failure, exceptions.HTTPError)


def first_line(error: BaseException) -> str:
    """The first line of an error's text, or its type's name when it has none."""
    return _one_line(str(error)) or type(error).__name__


def _one_line(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0] if text else ""


def _is_api_exception(failure: BaseException) -> bool:
    # Only a loaded client can have raised one; looking it up in sys.modules imports nothing.
    exceptions = sys.modules.get("kubernetes.client.exceptions")
    return exceptions is not None and isinstance(failure, exceptions.ApiException)


def _of_answer(status: int, *, reason: str, body: object, headers: Mapping[str, str], what: str) -> KubeError:
    phrase = reason or _phrase(status)
    message = _message(body)
    text = f"{what}: {status} {phrase}" + (f": {message}" if message else "")
    kind = _BY_STATUS.get(status) or (ServerError if status >= 500 else KubeError)
    return kind(text, status=status, retry_after_s=_retry_after(headers) if status == 429 or status >= 500 else None)


def _phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "error"


def _message(body: object) -> str:
    """The apiserver's Status ``message`` (one line), or "" when the body is not a Status."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not isinstance(body, str) or not body:
        return ""
    try:
        decoded = json.loads(body)
    except ValueError:
        return ""
    message = decoded.get("message") if isinstance(decoded, dict) else None
    return _one_line(message) if isinstance(message, str) else ""


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Retry-After in seconds (the apiserver sends whole seconds; an HTTP date is not honoured)."""
    for key, value in headers.items():
        if key.lower() == "retry-after":
            try:
                seconds = float(str(value).strip())
            except ValueError:
                return None
            return seconds if seconds >= 0 else None
    return None


_OBJECT_PREFIX = re.compile(r"^<[^>]* object at 0x[0-9a-f]+>: ")


def _transport_reason(failure: BaseException) -> str:
    # urllib3 wraps the cause of its last try in MaxRetryError.reason; its text starts with the
    # connection object's repr, which says nothing to a reader.
    cause = getattr(failure, "reason", None)
    if isinstance(cause, BaseException) and type(failure).__name__ == "MaxRetryError":
        failure = cause
    return _OBJECT_PREFIX.sub("", first_line(failure))
