"""Kubernetes objects read from manifest files, directories or stdin, as kubectl reads them.

Inputs: files, directories (recursively, ``.yaml``/``.yml``/``.json``), ``-`` for stdin; multi-document
YAML and ``kind: List`` are expanded. Any problem is one ``InputError`` naming the file and the
document (``path#index``). ``dry-run``, ``audit -f``, ``explain`` and ``simulate`` all read through here.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

import yaml

from webhook import config
from webhook.cmdline import errors

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Document:
    """One Kubernetes object read from an input, with where it came from (``path#index``)."""

    source: str
    object: dict[str, Any]


def read(paths: Sequence[str], *, stdin: TextIO) -> list[Document]:
    """Every object in ``paths``, in order; any problem is one ``InputError`` naming file and document."""
    documents: list[Document] = []
    for path in paths:
        for name, text in _inputs(path, stdin=stdin):
            documents.extend(parse(text, name=name, as_json=name.endswith(".json")))
    return documents


def parse(text: str, *, name: str, as_json: bool = False) -> list[Document]:
    """The objects in one file's text: YAML documents (or one JSON document), ``List`` expanded."""
    documents: list[Document] = []
    for index, data in _loaded(text, name=name, as_json=as_json):
        source = f"{name}#{index}"
        if data is None:
            continue  # an empty YAML document, e.g. after a trailing '---'
        obj = _checked_object(data, source=source)
        if obj["kind"] == "List" or (obj["kind"].endswith("List") and "items" in obj):
            items = obj.get("items")
            if not isinstance(items, list):
                raise errors.InputError(f"{source}: {obj['kind']}.items must be a list")
            for position, item in enumerate(items):
                item_source = f"{source}/items/{position}"
                documents.append(Document(source=item_source, object=_checked_object(item, source=item_source)))
        else:
            documents.append(Document(source=source, object=obj))
    return documents


def _inputs(path: str, *, stdin: TextIO) -> Iterator[tuple[str, str]]:
    if path == "-":
        try:
            yield "-", stdin.read()
        except UnicodeDecodeError as error:
            raise errors.InputError(f"-: stdin is not UTF-8 text: {error.reason}") from error
        return
    root = pathlib.Path(path)
    if root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.suffix in MANIFEST_SUFFIXES and p.is_file())
        if not files:
            raise errors.InputError(f"{path}: no {'/'.join(MANIFEST_SUFFIXES)} files in this directory")
    else:
        files = [root]
    for file in files:
        try:
            yield str(file), file.read_text(encoding="utf-8")
        except FileNotFoundError as error:
            raise errors.InputError(f"{file}: no such file or directory") from error
        except UnicodeDecodeError as error:
            raise errors.InputError(f"{file}: not UTF-8 text: {error.reason}") from error
        except OSError as error:
            raise errors.InputError(f"{file}: cannot read: {error.strerror or error}") from error


class _ManifestLoader(yaml.SafeLoader):
    """Safe YAML as kubectl reads it: an unquoted date stays a string, it never becomes a datetime."""


_ManifestLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _loaded(text: str, *, name: str, as_json: bool) -> Iterator[tuple[int, object]]:
    if as_json:
        try:
            yield 0, json.loads(text)
        except ValueError as error:
            raise errors.InputError(f"{name}#0: invalid JSON: {error}") from error
        return
    produced = 0
    try:
        for data in yaml.load_all(text, Loader=_ManifestLoader):  # noqa: S506 - a SafeLoader subclass
            yield produced, data
            produced += 1
    except yaml.YAMLError as error:
        raise errors.InputError(f"{name}#{produced}: invalid YAML: {config.yaml_reason(error)}") from error


def _checked_object(data: object, *, source: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise errors.InputError(f"{source}: not a Kubernetes object (a {type(data).__name__}, not a mapping)")
    for key in ("apiVersion", "kind"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise errors.InputError(f"{source}: not a Kubernetes object: {key} is missing or not a string")
    metadata = data.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise errors.InputError(f"{source}: metadata must be a mapping")
    if isinstance(metadata, dict) and "namespace" in metadata and not isinstance(metadata["namespace"], str):
        raise errors.InputError(f"{source}: metadata.namespace must be a string")
    try:
        json.dumps(data)
    except (TypeError, ValueError) as error:
        raise errors.InputError(f"{source}: not representable as JSON: {error}") from error
    return data
