"""Kubernetes Events on denied workloads: built here, sent in the background, never in the review's way.

Users of Kyverno look for a ``PolicyViolation`` Event beside a refused object (``kubectl get
events -n NS``, ``kubectl describe``); this module gives them one. The Event is the legacy
core/v1 shape client-go's recorder writes (``involvedObject``, ``reason``, ``message``, ``type:
Warning``, ``source.component``, ``firstTimestamp``/``lastTimestamp``, ``count``; the name
``<object name>.<unix nanoseconds in hex>``), in the namespace of the refused object, naming the
policies that refused it. On a CREATE the object does not exist yet, so ``involvedObject`` carries
no uid: ``kubectl get events --field-selector involvedObject.name=NAME`` finds it.

The admission answer never waits for an Event:

- ``Recorder.record`` is synchronous and does a dict lookup and a ``put_nowait``: it never blocks
  and never raises; the review's answer is built already.
- Rate limit: one Event per (namespace, kind, name, policies) per ``interval_s`` (default 60 s);
  the keys are kept in a bounded LRU (``max_keys``), so a flood of distinct names costs bounded
  memory.
- A bounded queue (``queue_size``): when the sender falls behind, new Events are dropped and
  counted (``dropped``), never queued without limit.
- One background task sends them (the ``kubernetes`` client is blocking: ``asyncio.to_thread``),
  each with a short timeout; a failure is logged and forgotten.
- Server-side dry-run reviews record nothing (the webhook declares no side effects).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import datetime
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

REASON = "PolicyViolation"  # Kyverno's reason for the same event
NOTICE_REASON = "KeptOffGpuNodes"  # GPU103's notice on a pod it kept off GPU nodes
COMPONENT = "gpu-admission"
DEFAULT_INTERVAL_S = 60.0
DEFAULT_QUEUE_SIZE = 256
DEFAULT_MAX_KEYS = 4096
MAX_MESSAGE = 1024  # events.k8s.io/v1 caps a note at 1 KiB; the core/v1 message is kept to the same


@dataclasses.dataclass(frozen=True, kw_only=True)
class Denial:
    """What was refused, by which policies, with the message the user saw."""

    namespace: str
    kind: str
    name: str
    api_version: str = ""
    uid: str = ""
    operation: str = ""
    policies: tuple[str, ...] = ()
    message: str = ""
    # A notice (GPU103's "kept off GPU nodes") is written as it is, with its own reason and type.
    reason: str = REASON
    type: str = "Warning"

    @property
    def key(self) -> tuple[str, str, str, tuple[str, ...]]:
        return (self.namespace, self.kind, self.name, self.policies)

    @classmethod
    def of(
        cls, obj: Mapping[str, Any] | None, *, namespace: str, kind: str, operation: str, policies: Sequence[str], message: str
    ) -> Denial | None:
        """The denial of a reviewed object; None where there is nothing to name (no namespace, no name)."""
        metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
        metadata = metadata if isinstance(metadata, Mapping) else {}
        name = metadata.get("name") or metadata.get("generateName")
        if not namespace or not isinstance(name, str) or not name or not kind:
            return None
        uid = metadata.get("uid")
        api_version = obj.get("apiVersion") if isinstance(obj, Mapping) else ""
        return cls(
            namespace=namespace,
            kind=kind,
            name=name,
            api_version=api_version if isinstance(api_version, str) else "",
            uid=uid if isinstance(uid, str) and operation != "CREATE" else "",
            operation=operation,
            policies=tuple(sorted(set(policies))),
            message=message,
        )


def notice_of(obj: Mapping[str, Any] | None, *, namespace: str, policy: str, notice: str) -> Denial | None:
    """A stored pod's notice (GPU103: why it is kept off GPU nodes) as a Normal Event on the pod.

    Written by the validating webhook, which sees the pod's generated name and its uid, so
    `kubectl describe pod` (which asks for the uid) lists it; None where there is nothing to name."""
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    metadata = metadata if isinstance(metadata, Mapping) else {}
    name, uid = metadata.get("name"), metadata.get("uid")
    if not namespace or not isinstance(name, str) or not name:
        return None
    return Denial(
        namespace=namespace,
        kind="Pod",
        name=name,
        api_version="v1",
        uid=uid if isinstance(uid, str) else "",
        operation="CREATE",
        policies=(policy,),
        message=f"{policy}: {notice}",
        reason=NOTICE_REASON,
        type="Normal",
    )


def event_body(denial: Denial, *, now: float) -> dict[str, Any]:
    """The core/v1 Event recording `denial` at Unix time `now`."""
    stamp = datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    involved = {"kind": denial.kind, "namespace": denial.namespace, "name": denial.name}
    if denial.api_version:
        involved["apiVersion"] = denial.api_version
    if denial.uid:
        involved["uid"] = denial.uid
    named = ", ".join(denial.policies) or "a policy"
    message = f"{denial.operation or 'request'} denied by {named}: {denial.message}".strip()
    if denial.reason != REASON:
        message = denial.message
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            # client-go's recorder names an Event `<object>.<unix nanos in hex>`; a generateName ends in '-'
            "name": f"{denial.name.rstrip('-.')}.{int(now * 1e9):x}",
            "namespace": denial.namespace,
            "labels": {"app.kubernetes.io/managed-by": COMPONENT},
        },
        "involvedObject": involved,
        "reason": denial.reason,
        "message": message,
        "type": denial.type,
        "source": {"component": COMPONENT},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


Send = Callable[[dict[str, Any]], None]


class Recorder:
    """Rate-limited, bounded, fire-and-forget Events (see the module docstring)."""

    def __init__(
        self,
        send: Send,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        max_keys: int = DEFAULT_MAX_KEYS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._send = send
        self._interval_s = interval_s
        self._queue_size = queue_size
        self._max_keys = max_keys
        self._clock = clock
        self._wall = wall
        self._last: collections.OrderedDict[tuple[str, str, str, tuple[str, ...]], float] = collections.OrderedDict()
        self._queue: asyncio.Queue[dict[str, Any]] | None = None
        self.recorded = 0
        self.suppressed = 0
        self.dropped = 0
        self.failed = 0
        self.sent = 0

    def record(self, denial: Denial | None) -> bool:
        """Queue an Event for `denial` unless rate-limited or the queue is full; never blocks, never raises."""
        try:
            return self._record(denial)
        except Exception:  # noqa: BLE001 - an Event must never fail an admission answer
            log.debug("uid=- event not recorded", exc_info=True)
            return False

    def _record(self, denial: Denial | None) -> bool:
        if denial is None:
            return False
        now = self._clock()
        last = self._last.get(denial.key)
        if last is not None and now - last < self._interval_s:
            self.suppressed += 1
            return False
        queue = self._queue
        if queue is None or queue.full():
            self.dropped += 1
            return False
        queue.put_nowait(event_body(denial, now=self._wall()))
        self._last[denial.key] = now
        self._last.move_to_end(denial.key)
        while len(self._last) > self._max_keys:
            self._last.popitem(last=False)
        self.recorded += 1
        return True

    async def _drain(self, queue: asyncio.Queue[dict[str, Any]]) -> None:
        while True:
            body = await queue.get()
            try:
                await asyncio.to_thread(self._send, body)
                self.sent += 1
            except Exception as error:  # noqa: BLE001 - a lost Event is logged, never raised
                self.failed += 1
                log.warning(
                    "uid=- event %s/%s for %s/%s not written: %s",
                    body["metadata"]["namespace"],
                    body["metadata"]["name"],
                    body["involvedObject"]["kind"],
                    body["involvedObject"]["name"],
                    str(error).splitlines()[0] if str(error) else type(error).__name__,
                )
            finally:
                queue.task_done()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Recorder]:
        """The sender's lifetime: Events are accepted only inside it."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=self._queue_size)
        self._queue = queue
        task = asyncio.create_task(self._drain(queue), name="gpu-admission-events")
        try:
            yield self
        finally:
            self._queue = None
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def lifetime(self, app: web.Application) -> AsyncIterator[None]:
        """For ``app.cleanup_ctx``."""
        async with self.running():
            yield
