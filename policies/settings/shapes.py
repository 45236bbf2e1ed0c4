"""Reading a settings document's shapes: the one error, and the readers of keys, lists, flags, names and times.

Every section of the settings reads its part of the document through these, so a malformed value is
refused the same way everywhere: `InvalidSettings` with one line that names the field.
"""

from __future__ import annotations

import datetime
import fnmatch
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any


class InvalidSettings(ValueError):
    """A settings document that cannot be used; the message is one line naming the field."""


_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # a namespace name (DNS label)


def flag(value: object, *, field: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidSettings(f"{field}: must be true or false, got {value!r}")
    return value


def keys(value: Mapping[str, Any], *, field: str, known: Sequence[str]) -> None:
    for key in value:
        if key not in known:
            raise InvalidSettings(f"{field}.{key}: unknown key; known: {', '.join(known)}")


def entries(
    value: object, *, field: str, known: Sequence[str], shape: str = "a mapping"
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each entry of a list of mappings with only `known` keys, and the field that names it."""
    if not isinstance(value, list):
        raise InvalidSettings(f"{field}: must be a list, got {value!r}")
    for index, entry in enumerate(value):
        where = f"{field}[{index}]"
        if not isinstance(entry, Mapping):
            raise InvalidSettings(f"{where}: must be {shape}, got {entry!r}")
        keys(entry, field=where, known=known)
        yield where, entry


def strings(value: object, *, field: str, allow_empty_list: bool = False) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise InvalidSettings(f"{field}: must be a list of non-empty strings, got {value!r}")
    if not value and not allow_empty_list:
        raise InvalidSettings(f"{field}: must not be empty")
    return tuple(value)


def namespace_names(value: object, *, field: str) -> frozenset[str]:
    names = strings(value, field=field)
    for index, name in enumerate(names):
        if not _NAME.match(name) or len(name) > 63:
            raise InvalidSettings(f"{field}[{index}]: {name!r} is not a namespace name")
    return frozenset(names)


def timestamp(value: object, *, field: str) -> datetime.datetime:
    if isinstance(value, datetime.datetime):
        return aware(value)
    if isinstance(value, datetime.date):  # YAML reads a bare 2026-12-31 as a date
        return datetime.datetime(value.year, value.month, value.day, tzinfo=datetime.UTC)
    if isinstance(value, str):
        try:
            return aware(datetime.datetime.fromisoformat(value.strip()))
        except ValueError:
            pass
    raise InvalidSettings(f"{field}: must be an RFC 3339 time like 2026-12-31T00:00:00Z, got {value!r}")


def aware(moment: datetime.datetime) -> datetime.datetime:
    if moment.tzinfo is None:
        return moment.replace(tzinfo=datetime.UTC)
    return moment.astimezone(datetime.UTC)


def mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def labels(value: object) -> Mapping[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, Mapping) else {}


def glob(name: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(name, pattern)
