"""A module imported on its first use, for the kubernetes client.

Importing ``kubernetes`` loads every API class and model: about 17 MiB resident and a third of a
second. ``serve`` from certificate files with no cluster never calls the API, nor does a worker
forked before it would, so the package holds the client's modules as ``Module`` and pays for them
only when it first reaches a cluster. ``webhook.kube`` (the one kube adapter) is where they are
made; it imports the real modules under ``typing.TYPE_CHECKING`` so type checkers and the
import-linter contracts still see them, and the rest of the package imports the handles from it
(``from webhook.kube import client, client_exceptions``).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class Module:
    """Stands for the module ``name``; the first attribute read imports it."""

    __slots__ = ("_module", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attribute: str) -> Any:
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attribute)

    def __repr__(self) -> str:
        state = "imported" if self._module is not None else "not imported yet"
        return f"<lazy module {self._name!r}, {state}>"
