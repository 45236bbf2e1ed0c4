"""``gpu-admission policies``: user-policy tools; ``export-vap`` writes ValidatingAdmissionPolicies.

``export-vap`` turns the built-in rules CEL can express and the user policies into
ValidatingAdmissionPolicy + binding manifests (see ``webhook.commands.vap``) for ``kubectl apply -f``.
``list`` shows every policy the engine would run with the given settings and policies directory.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
from pathlib import Path

import yaml

from policies import cel, engine
from webhook import config
from webhook.cmdline import errors, flags
from webhook.commands import vap


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
    listing = commands.add_parser("list", help="the policies the engine runs, with their actions and sources")
    for sub in (export, listing):
        sub.add_argument("--policies-dir", metavar="DIR", help="directory of GpuAdmissionPolicy YAML files")
        sub.add_argument("--config", metavar="FILE", help="settings YAML (actions, overrides, exceptions, exempt namespaces)")
    export.add_argument(
        "-o", "--output", default="yaml", metavar="FORMAT",
        help="yaml (a multi-document stream, the default) or json (a v1 List); '-o FILE', the old spelling of "
        "--output-file, still works with a deprecation warning",
    )
    flags.add_output_file(export)
    flags.add_output(listing, ("table", "json", "yaml"))
    export.set_defaults(func=run_export)
    listing.set_defaults(func=run_list)


def run_export(args: argparse.Namespace) -> int:
    loaded = config.load(args.config, policies_dir=args.policies_dir)
    exported = vap.export(loaded, now=datetime.datetime.now(datetime.timezone.utc))
    for note in exported.notes:
        print(f"note: {note}", file=sys.stderr)
    output, output_file = _export_output(args.output, args.output_file)
    if output == "json":
        document = {"apiVersion": "v1", "kind": "List", "items": list(exported.manifests)}
        text = json.dumps(document, indent=2) + "\n"
    else:
        text = vap.render(exported.manifests)
    if output_file is None:
        sys.stdout.write(text)
    else:
        _write(Path(output_file), text)
        print(f"wrote {len(exported.manifests)} manifests to {output_file}", file=sys.stderr)
    return 0


EXPORT_OUTPUTS = ("yaml", "json")


def _export_output(output: str, output_file: str | None) -> tuple[str, str | None]:
    """The format and file: ``-o`` names a format; any other ``-o`` value is the file of the old
    ``-o FILE`` spelling (YAML), accepted with a warning unless ``--output-file`` is given too."""
    if output in EXPORT_OUTPUTS:
        return output, output_file
    if output_file is not None:
        raise errors.InputError(f"-o takes {'|'.join(EXPORT_OUTPUTS)}, not {output!r}")
    print(f"warning: '-o {output}' as a file name is deprecated: use --output-file {output}", file=sys.stderr)
    return "yaml", output


def run_list(args: argparse.Namespace) -> int:
    loaded = config.load(args.config, policies_dir=args.policies_dir)
    rows = [("ID", "KIND", "ACTION", "SOURCE", "SUMMARY")]
    for item in (*engine.POLICIES, *loaded.user_policies):
        spec = cel.spec_of(item)
        rows.append((item.id, str(item.kind), str(loaded.action(item.id)), spec.source if spec else "built-in", item.summary))
    if args.output != "table":
        listed = [dict(zip(("id", "kind", "action", "source", "summary"), row, strict=True)) for row in rows[1:]]
        sys.stdout.write(json.dumps(listed, indent=2) + "\n" if args.output == "json" else yaml.safe_dump(listed, sort_keys=False))
        return 0
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        sys.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True)) + "  " + row[4] + "\n")
    return 0


def _write(target: Path, text: str) -> None:
    """Write `target` whole: a temporary file beside it, renamed over it."""
    try:
        descriptor, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    except OSError as error:
        raise errors.InputError(f"{target}: cannot write: {error.strerror or error}") from error
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except OSError as error:
        Path(temporary).unlink(missing_ok=True)
        raise errors.InputError(f"{target}: cannot write: {error.strerror or error}") from error
