"""A settings file read again when its bytes change: the labeler's `usageLimits` and the
extender's `gpuBudgets` come from the webhook's settings file this way.

A ConfigMap mounted as a volume is updated in place when it is edited (the kubelet's next sync of
the pod, about a minute), so an edit applies without a restart. `read` raises
`errors.InputError` with one line naming the key: at start that stops the process (the caller
lets it through); later the line is logged and the last good value stays in force, as the webhook
keeps its last good settings. The file is looked at no more than once per `every_s`, and only when
the value is asked for.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

from webhook.cmdline import errors

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


class SettingsFile(Generic[_T]):
    """What `read` makes of the file at `path`, read again when the file changes (see the module docstring)."""

    def __init__(
        self,
        path: Path,
        *,
        read: Callable[[Path], _T],
        what: str,
        describe: Callable[[_T], str] = lambda _: "",
        every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._path, self._read, self._what, self._describe = path, read, what, describe
        self._every_s, self._clock = every_s, clock
        self._seen = contents(path)
        self._value = read(path)
        self._looked = clock()
        self.reloads = 0  # for tests and logs: how many changes were taken
        self.refusals = 0  # changes that did not load (the previous value stayed)
        self.problem = ""  # the last refusal's line, "" once a change loads again

    def current(self) -> _T:
        """The value under the file as it is now (at most `every_s` old)."""
        self._refresh()
        return self._value

    def _refresh(self) -> None:
        now = self._clock()
        if now - self._looked < self._every_s:
            return
        self._looked = now
        found = contents(self._path)
        if found == self._seen:
            return
        self._seen = found
        try:
            self._value = self._read(self._path)
        except errors.InputError as error:
            self.refusals += 1
            self.problem = str(error)
            logger.error("%s: the changed file is refused, the previous %s stay in force: %s", self._what, self._what, error)
            return
        self.reloads += 1
        self.problem = ""
        logger.info("%s: read again from %s%s", self._what, self._path, self._describe(self._value))


def contents(path: Path) -> bytes:
    """The file's bytes; an unreadable file counts as content too (its error number)."""
    try:
        return path.read_bytes()
    except OSError as error:
        return f"unreadable:{error.errno}".encode()
