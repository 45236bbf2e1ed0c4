"""Reloading ``--config`` and ``--policies-dir`` while serving, without a restart.

In a cluster both are ConfigMaps mounted as files. The kubelet updates such a volume by writing a
new timestamped directory and swapping the ``..data`` symlink, so a file's path stays the same
while its content (and the inode behind the path) changes; an mtime on the path is not a
reliable signal. The watcher therefore hashes the content of the configuration file and of every
policy file every ``interval`` seconds (they are small) and reloads when the hash moves.

A reload loads and compiles everything first and only then swaps the settings the handlers read
(``keys.LIVE_SETTINGS``), so a review sees the old or the new configuration, never a mix. An
invalid configuration is refused with the one-line message of ``config.load`` (naming the file and
the field), logged, counted in ``gpu_admission_config_reload_errors_total``, and the last good
configuration stays in force; ``gpu_admission_config_last_reload_success_timestamp_seconds`` says
since when. The same broken content is reported once, not on every poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import pathlib
import time
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from policies import settings
from webhook import config
from webhook.admission import keys
from webhook.cmdline import errors
from webhook.config import userpolicies
from webhook.serving import metrics

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 3.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Source:
    """Where the configuration comes from: the two flags."""

    config_path: str | None = None
    policies_dir: str | None = None

    @property
    def watched(self) -> bool:
        """Whether there is anything to watch."""
        return self.config_path is not None or self.policies_dir is not None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReloadMetrics:
    """The reload's metrics, registered in the app's registry."""

    errors: metrics.Counter
    last_success: metrics.Gauge


def register(registry: metrics.Registry) -> ReloadMetrics:
    """Register the reload metrics in `registry`."""
    last_success = metrics.Gauge(
        "gpu_admission_config_last_reload_success_timestamp_seconds",
        "Unix time the configuration in force was loaded (at start or by a reload).",
        (),
        multiprocess_mode="livemin",  # under --workers: the worker that reloaded longest ago
    )
    registry.register(last_success)
    refused = registry.register(
        metrics.Counter(
            "gpu_admission_config_reload_errors_total",
            "Configuration reloads refused (the last good configuration stayed in force).",
            (),
        )
    )
    refused.inc(0)  # a sample from the start, so an alert on increase() sees the first error
    return ReloadMetrics(errors=refused, last_success=last_success)


def fingerprint(source: Source) -> str:
    """A hash of everything the configuration is read from; unreadable files count as content too."""
    digest = hashlib.sha256()
    paths: list[str] = []
    if source.config_path is not None:
        paths.append(source.config_path)
    if source.policies_dir is not None:
        try:
            paths.extend(str(p) for p in userpolicies.files(source.policies_dir))
        except errors.InputError as error:
            digest.update(f"dir:{error}".encode())
    for path in paths:
        digest.update(path.encode() + b"\0")
        try:
            digest.update(pathlib.Path(path).read_bytes())
        except OSError as error:
            digest.update(f"unreadable:{error.errno}".encode())
        digest.update(b"\0")
    return digest.hexdigest()


def load(source: Source) -> settings.Settings:
    """The settings from `source`; raises ``errors.InputError`` with one line naming file and field."""
    return config.load(source.config_path, policies_dir=source.policies_dir)


@dataclasses.dataclass(kw_only=True)
class Watcher:
    """The state of one watch: what was seen last, and where the new settings go."""

    source: Source
    live: keys.LiveSettings
    meters: ReloadMetrics
    seen: str
    clock: Callable[[], float] = time.time

    async def check(self) -> bool:
        """Reload if the files changed; True when new settings are in force."""
        current = await asyncio.to_thread(fingerprint, self.source)
        if current == self.seen:
            return False
        self.seen = current
        try:
            loaded = await asyncio.to_thread(load, self.source)
        except errors.InputError as error:
            self.meters.errors.inc()
            log.error("uid=- configuration reload refused, the previous configuration stays in force: %s", error)
            return False
        self.live.current = loaded
        self.meters.last_success.set(self.clock())
        log.info(
            "uid=- configuration reloaded: %d user policies, %d namespace overrides, %d exceptions",
            len(loaded.user_policies),
            len(loaded.namespace_overrides),
            len(loaded.exceptions),
        )
        return True


def watch(
    source: Source, *, interval_s: float = DEFAULT_INTERVAL_S, clock: Callable[[], float] = time.time
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A ``cleanup_ctx`` entry that reloads `source` into the app's live settings every `interval_s`.

    The app's settings must have been loaded from `source` just before (that load is the first
    success). Without a file or directory to watch it only registers the metrics.
    """

    async def context(app: web.Application) -> AsyncIterator[None]:
        meters = register(app[keys.METRICS].registry)
        meters.last_success.set(clock())
        if not source.watched:
            yield
            return
        watcher = Watcher(
            source=source,
            live=app[keys.LIVE_SETTINGS],
            meters=meters,
            seen=await asyncio.to_thread(fingerprint, source),
            clock=clock,
        )
        task = asyncio.create_task(_loop(watcher, interval_s=interval_s), name="config-watch")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return context


async def _loop(watcher: Watcher, *, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await watcher.check()
        except Exception:  # noqa: BLE001 - a bug here must not end the watch, nor the server
            log.exception("uid=- configuration watch failed; retrying in %.0f s", interval_s)
