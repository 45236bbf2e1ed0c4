"""``gpu-admission policies``: user-policy tools; ``export-vap`` writes ValidatingAdmissionPolicies.

``export-vap`` turns the built-in rules CEL can express and the user policies into
ValidatingAdmissionPolicy + binding manifests (see ``webhook.commands.vap``) for ``kubectl apply -f``.
``list`` shows every policy the engine would run with the given settings and policies directory.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

import yaml

from policies import cel, engine
from webhook import config
from webhook.cmdline import flags, output
from webhook.commands import mutating_policy, vap

EXPORT_OUTPUTS = ("yaml", "json")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "policies",
        help="user (CEL) policies: list them, export ValidatingAdmissionPolicies",
        description="Tools for the built-in and user policies.",
    )
    commands = parser.add_subparsers(dest="policies_command", required=True, metavar="SUBCOMMAND")
    export = commands.add_parser(
        "export-vap",
        help="write ValidatingAdmissionPolicy + binding manifests (admissionregistration.k8s.io/v1)",
        description="Write the built-in validate rules CEL can express (GPU001-GPU004) and the user policies as "
        "ValidatingAdmissionPolicies with Deny bindings: a fail-closed layer inside kube-apiserver under the webhook.",
    )
    mutating_policy.add_parser(commands)  # export-map: GPU104 as a MutatingAdmissionPolicy
    listing = commands.add_parser("list", help="the policies the engine runs, with their actions and sources")
    for sub in (export, listing):
        sub.add_argument("--policies-dir", metavar="DIR", help="directory of GpuAdmissionPolicy YAML files")
        sub.add_argument("--config", metavar="FILE", help="settings YAML (actions, overrides, exceptions, exempt namespaces)")
    flags.add_output(export, EXPORT_OUTPUTS, default="yaml")  # yaml: a multi-document stream; json: a v1 List
    flags.add_output(listing, ("table", "json", "yaml"))
    for sub in (export, listing):
        flags.add_output_file(sub)
    export.set_defaults(func=run_export)
    listing.set_defaults(func=run_list)


def run_export(args: argparse.Namespace) -> int:
    loaded = config.load(args.config, policies_dir=args.policies_dir)
    exported = vap.export(loaded, now=datetime.datetime.now(datetime.UTC))
    for note in exported.notes:
        print(f"note: {note}", file=sys.stderr)
    if args.output == "json":
        document = {"apiVersion": "v1", "kind": "List", "items": list(exported.manifests)}
        text = json.dumps(document, indent=2) + "\n"
    else:
        text = vap.render(exported.manifests)
    output.emit(text, path=args.output_file)
    if output.to_file(args.output_file):
        print(f"wrote {len(exported.manifests)} manifests to {args.output_file}", file=sys.stderr)
    return 0


def run_list(args: argparse.Namespace) -> int:
    loaded = config.load(args.config, policies_dir=args.policies_dir)
    rows = [("ID", "KIND", "ACTION", "SOURCE", "SUMMARY")]
    for item in (*engine.POLICIES, *loaded.user_policies):
        spec = cel.spec_of(item)
        rows.append((item.id, str(item.kind), str(loaded.action(item.id)), spec.source if spec else "built-in", item.summary))
    if args.output != "table":
        listed = [dict(zip(("id", "kind", "action", "source", "summary"), row, strict=True)) for row in rows[1:]]
        output.emit(
            json.dumps(listed, indent=2) + "\n" if args.output == "json" else yaml.safe_dump(listed, sort_keys=False),
            path=args.output_file,
        )
        return 0
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = (
        "  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True)) + "  " + row[4] + "\n" for row in rows
    )
    output.emit("".join(lines), path=args.output_file)
    return 0
