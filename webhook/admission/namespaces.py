"""Namespace labels for the live webhook: an informer-style cache (list, then watch) of every Namespace.

AdmissionReviews carry no namespace labels, yet namespace overrides and exceptions select
namespaces by label. With cluster access, ``serve`` keeps ``{name: labels}`` here:

- ``Labels`` is the map. ``replace`` installs a full list, ``apply`` one watch event; both are pure
  bookkeeping (no I/O), shared by the watching thread and tests. Reads come from the event loop,
  writes from the thread, so a lock guards the dict.
- ``Informer`` runs the list/watch loop in a thread over a ``Source`` (the apiserver in
  ``webhook.admission.clustercontext``; a fake in tests): list, then watch from the list's resourceVersion;
  a watch that ends normally is resumed from the last resourceVersion seen (bookmarks included);
  ``webhook.kube.errors.Gone`` (HTTP 410) re-lists at once; any other error re-lists after a
  backoff (0.5 s, doubling, at most 30 s; reset by a successful list).

Until the first list succeeds the cache is not ``synced`` and ``/readyz`` answers 503, so a replica
never judges a review with labels it does not have yet. A namespace the cache has not seen (created
a moment ago, its event still on the way) is read once directly, bounded in time (``labels_for``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from webhook.kube import errors as kube_errors

log = logging.getLogger(__name__)

INITIAL_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0
WATCH_TIMEOUT_S = 300  # the apiserver ends a watch after this; it is then resumed
MISS_TIMEOUT_S = 1.0


class Labels:
    """``{namespace name: labels}``, kept in step with the cluster by an ``Informer``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._labels: dict[str, Mapping[str, str]] = {}
        self.resource_version = ""
        self.synced = False  # True once a full list has been installed

    def get(self, name: str) -> Mapping[str, str] | None:
        """The namespace's labels, or None when the cache does not know it."""
        with self._lock:
            return self._labels.get(name)

    def __len__(self) -> int:
        with self._lock:
            return len(self._labels)

    def snapshot(self) -> dict[str, Mapping[str, str]]:
        """Every known namespace's labels, as of now (`settingscheck`: does a budget select any?)."""
        with self._lock:
            return dict(self._labels)

    def replace(self, items: Iterable[Mapping[str, Any]], *, resource_version: str) -> None:
        """Install a full list (the items of a NamespaceList) and its resourceVersion."""
        fresh = {name: labels for name, labels in (_name_and_labels(item) for item in items) if name}
        with self._lock:
            self._labels = fresh
            self.resource_version = resource_version
            self.synced = True

    def apply(self, event: Mapping[str, Any]) -> None:
        """One watch event (``{"type": ..., "object": ...}``): ADDED/MODIFIED store, DELETED drops,
        BOOKMARK only moves the resourceVersion. An ERROR event raises the Kubernetes layer's error
        for its code: ``Gone`` for 410 (the resourceVersion is too old), another ``KubeError``
        otherwise (the informer re-lists either way, at once after a ``Gone``)."""
        kind = event.get("type")
        obj = event.get("object")
        obj = obj if isinstance(obj, Mapping) else {}
        if kind == "ERROR":
            code = obj.get("code")
            status = code if isinstance(code, int) else 0
            answer = kube_errors.Answer(
                status=status, body=json.dumps(dict(obj), default=str), reason=str(obj.get("reason") or "")
            )
            raise kube_errors.translate(answer, what="namespace watch")
        metadata = obj.get("metadata")
        metadata = metadata if isinstance(metadata, Mapping) else {}
        version = metadata.get("resourceVersion")
        name, labels = _name_and_labels(obj)
        with self._lock:
            if kind in ("ADDED", "MODIFIED") and name:
                self._labels[name] = labels
            elif kind == "DELETED" and name:
                self._labels.pop(name, None)
            elif kind != "BOOKMARK":
                log.debug("uid=- namespace watch: ignoring event %r", kind)
                return
            if isinstance(version, str) and version:
                self.resource_version = version


def _name_and_labels(obj: Mapping[str, Any]) -> tuple[str, Mapping[str, str]]:
    metadata = obj.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    name = metadata.get("name")
    labels = metadata.get("labels")
    labels = labels if isinstance(labels, Mapping) else {}
    return (name if isinstance(name, str) else ""), {str(k): str(v) for k, v in labels.items()}


class Source(Protocol):
    """Where Namespaces come from (blocking calls; the apiserver, or a fake in tests)."""

    def list(self) -> tuple[list[Mapping[str, Any]], str]:
        """Every Namespace and the list's resourceVersion."""

    def watch(self, *, resource_version: str, timeout_s: int) -> Iterator[Mapping[str, Any]]:
        """Watch events from `resource_version` until the server ends the watch; ``kube_errors.Gone`` on 410."""

    def read(self, name: str, *, timeout_s: float) -> Mapping[str, Any] | None:
        """One Namespace, or None when it does not exist."""

    def stop(self) -> None:
        """Make a watch in progress return soon (best effort)."""


@dataclasses.dataclass
class Informer:
    """The list/watch loop that keeps ``labels`` current (``start`` runs it in a daemon thread)."""

    source: Source
    labels: Labels = dataclasses.field(default_factory=Labels)
    watch_timeout_s: int = WATCH_TIMEOUT_S
    max_backoff_s: float = MAX_BACKOFF_S
    miss_timeout_s: float = MISS_TIMEOUT_S
    # Called with the reason whenever a list or watch fails (metrics, tests).
    on_error: Callable[[str], None] = lambda reason: None
    _stopping: threading.Event = dataclasses.field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        """Run the loop in a daemon thread (a blocked watch must not hold up the process's exit)."""
        self._thread = threading.Thread(target=self.run, name="namespace-informer", daemon=True)
        self._thread.start()

    def stop(self, *, wait_s: float = 0.0) -> None:
        """Ask the loop to end; wait up to `wait_s` for the thread."""
        self._stopping.set()
        try:
            self.source.stop()
        except Exception:  # noqa: BLE001 - stopping is best effort; the thread is a daemon
            log.debug("uid=- namespace informer: stopping the watch failed", exc_info=True)
        if self._thread is not None and wait_s > 0:
            self._thread.join(wait_s)

    def run(self) -> None:
        """List, watch, resume or re-list, until ``stop``."""
        backoff = INITIAL_BACKOFF_S
        listed = False
        while not self._stopping.is_set():
            try:
                if not listed:
                    items, version = self.source.list()
                    first = not self.labels.synced
                    self.labels.replace(items, resource_version=version)
                    listed, backoff = True, INITIAL_BACKOFF_S
                    if first:
                        log.info("uid=- namespace labels: listed %d namespaces (resourceVersion %s)", len(items), version)
                for event in self.source.watch(resource_version=self.labels.resource_version, timeout_s=self.watch_timeout_s):
                    if self._stopping.is_set():
                        return
                    self.labels.apply(event)
            except kube_errors.Gone as error:
                log.info("uid=- namespace watch expired (%s); listing again", error)
                listed = False
            except Exception as error:  # noqa: BLE001 - any failure re-lists after a backoff; the loop never ends on its own
                reason = str(error).splitlines()[0] if str(error) else type(error).__name__
                log.warning("uid=- namespace labels: %s; listing again in %.1fs", reason, backoff)
                self.on_error(reason)
                listed = False
                if self._stopping.wait(backoff):
                    return
                backoff = min(backoff * 2, self.max_backoff_s)

    async def labels_for(self, name: str) -> Mapping[str, str] | None:
        """The labels of `name`: from the cache, else read once (at most ``miss_timeout_s``; None
        when that fails, and the engine then assumes only ``kubernetes.io/metadata.name``)."""
        found = self.labels.get(name)
        if found is not None or not name:
            return found
        try:
            obj = await asyncio.wait_for(
                asyncio.to_thread(self.source.read, name, timeout_s=self.miss_timeout_s), timeout=self.miss_timeout_s
            )
        except Exception as error:  # noqa: BLE001 - a failed read only means labels unknown
            log.warning(
                "uid=- namespace labels: %s not cached and not readable: %s",
                name,
                str(error).splitlines()[0] if str(error) else type(error).__name__,
            )
            return None
        if obj is None:
            return None
        return _name_and_labels(obj)[1]
