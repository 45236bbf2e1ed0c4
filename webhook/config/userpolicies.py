"""Loading user (CEL) policies from a directory of YAML files (the ``--policies-dir`` flag).

Every ``.yaml``/``.yml`` file directly in the directory (not in subdirectories, as a mounted
ConfigMap is flat; hidden entries such as its ``..data`` are skipped, their content is reached
through the visible symlinks) may hold several documents, each one ``GpuAdmissionPolicy`` (see
``policies.cel``). Every expression is compiled here, once; any problem is one
``errors.InputError`` line naming the file, the document, the policy and the field.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import yaml

from policies import builtin, cel, policy
from webhook.cmdline import errors

SUFFIXES = (".yaml", ".yml")


def files(directory: str) -> list[pathlib.Path]:
    """The policy files under ``directory``, in a stable order; raises InputError when it is not a directory."""
    root = pathlib.Path(directory)
    if not root.is_dir():
        raise errors.InputError(f"{directory}: --policies-dir is not a directory")
    found = []
    for path in sorted(root.iterdir()):
        if path.name.startswith("."):
            continue
        if path.suffix in SUFFIXES and path.is_file():
            found.append(path)
    return found


def load(directory: str | None) -> tuple[policy.Policy, ...]:
    """The compiled policies in ``directory`` (none without one); IDs must be unique."""
    if directory is None:
        return ()
    env = cel.environment()
    loaded: list[policy.Policy] = []
    where: dict[str, str] = {p.id: "a built-in policy" for p in builtin.POLICIES}
    for path in files(directory):
        for index, document in _documents(path):
            source = f"{path}#{index}"
            try:
                item = cel.compile_policy(document, source=source, env=env)
            except cel.InvalidPolicy as error:
                raise errors.InputError(str(error)) from error
            if item.id in where:
                raise errors.InputError(f"{source}: policy {item.id}: spec.id: already used by {where[item.id]}")
            where[item.id] = source
            loaded.append(item)
    return tuple(loaded)


def _documents(path: pathlib.Path) -> Iterator[tuple[int, object]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise errors.InputError(f"{path}: cannot read policy file: {error}") from error
    index = 0
    try:
        for document in yaml.safe_load_all(text):
            if document is not None:
                yield index, document
            index += 1
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(error, "problem", None) or " ".join(str(error).split())
        raise errors.InputError(f"{path}#{index}: invalid YAML: {problem}{where}") from error
