"""``gpu-admission dry-run``: evaluate manifest files offline with the webhook's exact decision path.

Inputs: files, directories (recursively, ``.yaml``/``.yml``/``.json``), ``-`` for stdin; multi-document
YAML and ``kind: List`` are expanded. Exit status: 0 all allowed, 1 any denied, 2 unreadable or
invalid input (one line naming the file and document).

The printed ``object`` is the input with the patch applied. For a Pod that is what gets stored.
For a workload (Deployment, Job, CronJob, ...) it is not: the mutating webhook sees only Pods, so
the workload is stored unpatched and the patch lands on each pod created from its template. Each
result says which in ``patchAppliesTo`` (``PATCH_APPLIES_TO``), and the table adds a NOTE line
under a mutated workload.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypedDict

import jsonpatch
import yaml

from policies import model, podspec, settings
from webhook import config
from webhook.admission import decisions
from webhook.cmdline import errors, flags, manifests, output
from webhook.cmdline.manifests import Document

EXIT_ALLOWED, EXIT_DENIED = 0, 1
Output = Literal["table", "json", "yaml"]


class WireViolation(TypedDict):
    policy: str
    action: str
    message: str


class WireResult(TypedDict):
    source: str
    apiVersion: str
    kind: str
    namespace: str
    name: str
    allowed: bool
    violations: list[WireViolation]
    patch: list[dict[str, Any]]
    patchAppliesTo: str
    object: dict[str, Any]


class WireSummary(TypedDict):
    objects: int
    denied: int
    mutated: int


class WireReport(TypedDict):
    results: list[WireResult]
    summary: WireSummary


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
    """A document's decision and the object as the webhook would have let it through."""

    document: Document
    namespace: str
    decision: model.Decision
    patched: dict[str, Any]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "dry-run",
        help="evaluate manifests offline: verdicts and patches, exit 1 on any denial",
        description="Run the webhook's policies on manifest files. Exit 0: all allowed; 1: something is "
        "denied; 2: unreadable or invalid input.",
    )
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        metavar="PATH",
        help="file, directory (recursive .yaml/.yml/.json) or - for stdin; repeatable",
    )
    flags.add_output(parser, ("table", "json", "yaml"))
    flags.add_output_file(parser)
    parser.add_argument("--config", metavar="FILE", help="settings YAML (policy actions, exempt namespaces, ...)")
    parser.add_argument("--policies-dir", metavar="DIR", help="directory of user (CEL) policy YAML files")
    flags.add_namespaces(
        parser,
        namespace_help="namespace for objects that name none (default: default)",
        all_help=None,
        default=decisions.DEFAULT_NAMESPACE,
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    loaded = config.load(args.config, policies_dir=args.policies_dir)
    documents = manifests.read(args.filename, stdin=sys.stdin)
    outcomes = evaluate(documents, settings=loaded, default_namespace=args.namespace)
    output.emit(render(outcomes, output=args.output), path=args.output_file)
    return EXIT_DENIED if any(not outcome.decision.allowed for outcome in outcomes) else EXIT_ALLOWED


def evaluate(documents: Sequence[Document], *, settings: settings.Settings, default_namespace: str = "default") -> list[Outcome]:
    """Decide every document as the webhook would, and apply each patch to a copy of its object.

    Namespace documents among the inputs give their labels to the objects in them (for namespace
    overrides and exceptions by label selector).
    """
    labels = namespace_labels(documents)
    outcomes = []
    for document in documents:
        namespace = decisions.object_namespace(document.object) or default_namespace
        decision = decisions.decide(
            document.object, settings=settings, namespace=namespace, namespace_labels=labels.get(namespace)
        )
        try:
            patched = jsonpatch.apply_patch(copy.deepcopy(document.object), [dict(op) for op in decision.patch])
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as error:
            raise errors.InputError(f"{document.source}: the engine's patch does not apply: {error}") from error
        outcomes.append(Outcome(document=document, namespace=namespace, decision=decision, patched=patched))
    return outcomes


def namespace_labels(documents: Sequence[Document]) -> dict[str, dict[str, str]]:
    """The labels of every Namespace among `documents`, by name."""
    return settings.labels_by_namespace(document.object for document in documents)


def report(outcomes: Sequence[Outcome]) -> WireReport:
    """The machine-readable report (``-o json`` / ``-o yaml``)."""
    results: list[WireResult] = []
    for outcome in outcomes:
        obj = outcome.document.object
        results.append(
            {
                "source": outcome.document.source,
                "apiVersion": str(obj.get("apiVersion", "")),
                "kind": str(obj.get("kind", "")),
                "namespace": outcome.namespace,
                "name": _name(obj),
                "allowed": outcome.decision.allowed,
                "violations": [
                    {"policy": v.policy, "action": str(v.action), "message": v.message} for v in outcome.decision.violations
                ],
                "patch": [dict(op) for op in outcome.decision.patch],
                "patchAppliesTo": patch_applies_to(obj),
                "object": _redacted(outcome.patched),
            }
        )
    return {
        "results": results,
        "summary": {
            "objects": len(outcomes),
            "denied": sum(1 for o in outcomes if not o.decision.allowed),
            "mutated": sum(1 for o in outcomes if o.decision.patch),
        },
    }


def render(outcomes: Sequence[Outcome], *, output: Output) -> str:
    if output == "json":
        return json.dumps(report(outcomes), indent=2) + "\n"
    if output == "yaml":
        return yaml.safe_dump(report(outcomes), sort_keys=False, allow_unicode=True)
    return render_table(outcomes)


def render_table(outcomes: Sequence[Outcome]) -> str:
    """One row per object, then an indented line per violation and per patch operation."""
    rows = [("SOURCE", "OBJECT", "NAMESPACE", "RESULT")]
    details: list[list[str]] = [[]]
    for outcome in outcomes:
        decision = outcome.decision
        obj = outcome.document.object
        rows.append((outcome.document.source, f"{obj.get('kind')}/{_name(obj) or '-'}", outcome.namespace, _verdict(decision)))
        lines = [f"{v.action.upper():<7} {v.message}" for v in decision.violations]
        lines += [f"PATCH   {_describe_op(op)}" for op in decision.patch]
        if decision.patch and patch_applies_to(obj) == PATCH_APPLIES_TO_TEMPLATE_PODS:
            lines.append(
                f"NOTE    {obj.get('kind')} is stored unpatched; the patch applies to the pods created from its template"
            )
        if decision.exempt_reason:
            lines.append(f"EXEMPT  {decision.exempt_reason}")
        details.append(lines)
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    out: list[str] = []
    for row, lines in zip(rows, details, strict=True):
        out.append("  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)) + "  " + row[3])
        out.extend(f"    {line}" for line in lines)
    summary = report(outcomes)["summary"]
    out.append("")
    out.append(f"{summary['objects']} object(s): {summary['denied']} denied, {summary['mutated']} mutated")
    return "\n".join(out) + "\n"


PATCH_APPLIES_TO_POD = "this pod, as stored"
PATCH_APPLIES_TO_TEMPLATE_PODS = "pods created from this template"
PATCH_APPLIES_TO_NOTHING = "nothing: this kind is not mutated"


def patch_applies_to(obj: Mapping[str, Any]) -> str:
    """What the mutating webhook's patch lands on in a cluster (the ``patchAppliesTo`` field)."""
    kind = obj.get("kind")
    if kind == "Pod":
        return PATCH_APPLIES_TO_POD
    if kind in podspec.WORKLOAD_KINDS:
        return PATCH_APPLIES_TO_TEMPLATE_PODS
    return PATCH_APPLIES_TO_NOTHING


def _verdict(decision: model.Decision) -> str:
    if not decision.allowed:
        return "DENIED"
    if decision.exempt_reason:
        return "allowed (exempt)"
    if any(v.action is model.Action.WARN for v in decision.violations) or decision.warnings:
        return "allowed (warnings)"
    return "allowed"


def _describe_op(op: Mapping[str, Any]) -> str:
    text = f"{op.get('op')} {op.get('path')}"
    if "value" in op:
        value = json.dumps(op["value"], separators=(",", ":"))
        text += f" = {value if len(value) <= 80 else value[:77] + '...'}"
    return text


REDACTED = "(redacted)"


def _redacted(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj`, but a Secret's values replaced (keys kept): the report never echoes a Secret value."""
    if obj.get("kind") != "Secret":
        return obj
    shown = dict(obj)
    for field in ("data", "stringData"):
        values = obj.get(field)
        if isinstance(values, Mapping):
            shown[field] = {key: REDACTED for key in values}
    return shown


def _name(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        return ""
    name = metadata.get("name") or metadata.get("generateName") or ""
    return str(name)
