"""``gpu-admission audit``: judge what already runs (or manifest files), print it, optionally write PolicyReports.

Exit status: 0 when no result fails at enforce level, 1 when one does, 2 for errors (one line, no
traceback). The reports written by ``--write-reports`` are exactly what ``-o json|yaml`` prints.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import yaml

from webhook import config
from webhook import kube as webhook_kube
from webhook.audit import kube, render, report, scan, sweep
from webhook.cmdline import errors, flags, manifests, output

OUTPUTS = ("table", "json", "yaml", "markdown", "html")
EXIT_CLEAN, EXIT_ENFORCED, EXIT_ERROR = 0, 1, 2


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``audit`` on the top-level CLI."""
    parser = subparsers.add_parser(
        "audit",
        help="audit what runs in the cluster (or manifest files): policies, GPU consistency, PolicyReports",
        description="Evaluate every validate policy and the GPU consistency checks (GPU201-GPU215) over "
        "existing Pods, workload templates and Nodes. Exit 0: nothing fails at enforce level; 1: something "
        "does; 2: an error.",
    )
    flags.add_cluster(parser)
    flags.add_namespaces(
        parser,
        namespace_help="audit only this namespace (node-level checks are left out)",
        all_help="audit every namespace and the nodes (the default)",
    )
    flags.add_output(parser, OUTPUTS)
    flags.add_output_file(parser)
    parser.add_argument(
        "--write-reports",
        action="store_true",
        help="replace the wgpolicyk8s.io/v1alpha2 PolicyReports (one per namespace) and the ClusterPolicyReport",
    )
    parser.add_argument(
        "--report-scope",
        choices=report.REPORT_SCOPES,
        default="namespace",
        help="namespace: one PolicyReport per namespace (the default); resource: one per object, named by its uid, "
        "with scope set and owned by the object, as Kyverno writes them",
    )
    parser.add_argument(
        "--all-results", action="store_true", help="store and show pass results too (default: everything but pass)"
    )
    parser.add_argument(
        "-f",
        "--filename",
        action="append",
        metavar="PATH",
        help="audit manifest files instead of a cluster: file, directory or - for stdin; repeatable",
    )
    flags.add_ledger_namespace(parser)
    parser.add_argument("--config", metavar="FILE", help="settings YAML (policy actions, exempt namespaces, ...)")
    parser.add_argument("--policies-dir", metavar="DIR", help="directory of user (CEL) policy YAML files")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The command; kube failures become one-line ``errors.InputError`` for the top-level CLI."""
    if args.filename and args.write_reports:
        raise errors.InputError("--write-reports needs a cluster; it cannot be combined with -f")
    if args.filename and (args.kubeconfig or args.context):
        raise errors.InputError("--kubeconfig/--context and -f exclude each other: -f audits files, not a cluster")
    settings = config.load(args.config, policies_dir=args.policies_dir)
    notice = settings.scheduler.profile.notice
    if notice:  # stderr: the reports on stdout keep their shape
        print(f"gpu-admission audit: {notice}", file=sys.stderr)
    now = time.time()
    try:
        if args.filename:
            documents = manifests.read(args.filename, stdin=sys.stdin)
            scope = sweep.scope_of(args.namespace)
            audit = scan.run(
                scan.Inventory.of(d.object for d in documents),
                settings=settings,
                scope=scope,
                now=now,
                ledger_namespace=args.ledger_namespace,
            )
            reports = sweep.reports(audit, all_results=args.all_results, now=now, scope=args.report_scope)
            written = None
        else:
            api = kube.api_client(args.kubeconfig, context=args.context)
            try:
                audit = sweep.audit_cluster(
                    api, settings=settings, namespace=args.namespace, now=now, ledger_namespace=args.ledger_namespace
                )
                if args.write_reports:
                    reports, written = sweep.write_reports(
                        api, audit, all_results=args.all_results, now=now, scope=args.report_scope
                    )
                else:
                    reports, written = sweep.reports(audit, all_results=args.all_results, now=now, scope=args.report_scope), None
            finally:
                webhook_kube.close(api)
    except webhook_kube.errors.KubeError as error:
        raise errors.InputError(str(error)) from error
    output.emit(_text(audit, reports, output=args.output, all_results=args.all_results), path=args.output_file)
    if written is not None:
        print(
            f"reports: {written.created} created, {written.replaced} replaced, {written.deleted} deleted, "
            f"{written.unchanged} unchanged",
            file=sys.stderr,
        )
    return EXIT_ENFORCED if audit.exit_status else EXIT_CLEAN


def _text(audit: scan.Audit, reports: dict[report.Key, report.WireReport | None], *, output: str, all_results: bool) -> str:
    if output == "json":
        return json.dumps(report.as_list(reports), indent=2) + "\n"
    if output == "yaml":
        document: Any = report.as_list(reports)
        return yaml.safe_dump(document, sort_keys=False, allow_unicode=True)
    return render.render(audit, output=output, all_results=all_results)


def main(argv: list[str] | None = None) -> int:
    """``audit`` on its own (tests, ``python -m webhook.audit.cli``): errors as one line, exit status 2."""
    parser = argparse.ArgumentParser(prog="gpu-admission")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["audit", *(argv if argv is not None else sys.argv[1:])])
    try:
        status: int = args.func(args)
    except errors.InputError as error:
        print(f"gpu-admission: error: {error}", file=sys.stderr)
        return EXIT_ERROR
    return status


if __name__ == "__main__":  # pragma: no cover - for running without the top-level CLI
    sys.exit(main())
