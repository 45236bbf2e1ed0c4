"""Loading the engine settings from a YAML file (``--config``) and user policies (``--policies-dir``)."""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import yaml

from policies import settings
from webhook.cmdline import errors
from webhook.config import userpolicies


def load(path: str | None, *, policies_dir: str | None = None) -> settings.Settings:
    """Read ``path`` as a settings document; no path means the built-in defaults.

    ``policies_dir`` holds user (CEL) policies (``webhook.config.userpolicies``); they join the built-ins,
    and the document may name their IDs. Every problem (missing file, bad YAML, a field the engine
    rejects, a policy that does not compile) becomes one ``errors.InputError`` line that names the file.
    """
    user_policies = userpolicies.load(policies_dir)
    if path is None:
        return settings.from_mapping({}, user_policies=user_policies)
    return load_section(path, lambda data: settings.from_mapping(data or {}, user_policies=user_policies))


_T = TypeVar("_T")


def load_section(path: str | pathlib.Path, read: Callable[[Mapping[str, Any] | None], _T]) -> _T:
    """What ``read`` makes of the settings document at ``path``: the whole settings (``load``), or one
    section (``settings.budgets_of``: the rest is the webhook's, and may name user policies the reader
    does not load). Every problem is one ``errors.InputError`` line naming the file."""
    try:
        text = pathlib.Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise errors.InputError(f"{path}: cannot read config: {_reason(error)}") from error
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise errors.InputError(f"{path}: invalid YAML: {yaml_reason(error)}") from error
    if data is not None and not isinstance(data, dict):
        raise errors.InputError(f"{path}: config must be a mapping, not {type(data).__name__}")
    try:
        return read(data)
    except settings.InvalidSettings as error:
        raise errors.InputError(f"{path}: {error}") from error


def _reason(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def yaml_reason(error: yaml.YAMLError) -> str:
    """A PyYAML error on one line: the problem and where it is (its messages span several lines)."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        return f"{error.problem} (line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(error).split())
