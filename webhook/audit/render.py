"""The audit for people: a terminal table, Markdown for a PR comment, one self-contained HTML page.

Pure: an `scan.Audit` in, text out. All three show the results a report would store (everything
but `pass` by default, everything with `all_results`), grouped per namespace with the cluster
(nodes) last, after a summary. The HTML page has no external assets (inline CSS, no scripts,
no fonts or images to fetch) and draws every GPU node's cards as allocated/total bars, the
picture `gpu-admission inspect` prints as a table (from the same `inspection` data, so the
figures agree); the Markdown embeds that table itself.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping

from policies import gpu, model
from policies.gpu import dra, inspection
from webhook.audit import findings, report, scan

_BAR_WIDTH = 20


def selected(audit: scan.Audit, *, all_results: bool) -> list[findings.Finding]:
    """The findings to show: what a report stores (`report.stored`)."""
    if all_results:
        return list(audit.findings)
    return [f for f in audit.findings if f.result is not model.Result.PASS]


def grouped(items: Iterable[findings.Finding]) -> dict[str, list[findings.Finding]]:
    """Findings per namespace, namespaces sorted, the cluster-scoped ones ("" key) last."""
    groups: dict[str, list[findings.Finding]] = {}
    for item in items:
        groups.setdefault(item.namespace, []).append(item)
    return {key: groups[key] for key in sorted(groups, key=lambda k: (k == "", k))}


def summary_line(audit: scan.Audit) -> str:
    """One line: what was audited and how it came out (all results, whatever is shown)."""
    tally, enforced = report.tallied(audit.findings)
    parts = ", ".join(f"{tally[name]} {name}" for name in ("fail", "warn", "error", "skip", "pass"))
    folded = f"; {audit.folded} repeated on controlled objects left out" if audit.folded else ""
    verdict = f"{enforced} at enforce level" if enforced else "nothing at enforce level"
    return f"{audit.objects} object(s) audited: {parts}{folded}; {verdict}"


def admin_access_line(audit: scan.Audit) -> str:
    """The namespaces labelled for DRA admin access; "" where none is."""
    if not audit.admin_access_namespaces:
        return ""
    return f"DRA admin access allowed (label {dra.ADMIN_ACCESS_LABEL}=true) in namespaces: {', '.join(audit.admin_access_namespaces)}"


def _objects(finding: findings.Finding) -> str:
    return finding.subject.display


# --- table ----------------------------------------------------------------------------------------


def table(audit: scan.Audit, *, all_results: bool = False) -> str:
    """A kubectl-style table, one row per result, then the summary line."""
    rows = [("NAMESPACE", "OBJECT", "POLICY", "RESULT", "ACTION", "SEVERITY", "MESSAGE")]
    for namespace, items in grouped(selected(audit, all_results=all_results)).items():
        for item in items:
            rows.append(
                (
                    namespace or "-",
                    _objects(item),
                    item.policy,
                    report.result_of(item),  # as the PolicyReport writes it: a warn-level failure is warn
                    item.action.value,
                    item.severity.value,
                    item.message,
                )
            )
    out: list[str] = []
    if len(rows) > 1:
        widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
        for row in rows:
            cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
            out.append("  ".join([*cells, row[-1]]).rstrip())
        out.append("")
    else:
        out.append("No findings." if not all_results else "Nothing audited.")
    out.append(summary_line(audit))
    if admin_access_line(audit):
        out.append(admin_access_line(audit))
    return "\n".join(out) + "\n"


# --- markdown -------------------------------------------------------------------------------------


def _md(text: str) -> str:
    """A table cell: pipes escaped, line breaks flattened."""
    return " ".join(text.replace("\\", "\\\\").replace("|", "\\|").split())


_ICON: Mapping[model.Result, str] = {
    model.Result.FAIL: "❌ fail",
    model.Result.ERROR: "⛔ error",
    model.Result.WARN: "⚠️ warn",
    model.Result.SKIP: "⏭️ skip",
    model.Result.PASS: "✅ pass",
}


def markdown(audit: scan.Audit, *, all_results: bool = False) -> str:
    """GitHub-flavoured Markdown suited to a pull-request comment."""
    tally = report.counts(audit.findings)
    out = ["## gpu-admission audit", ""]
    out.append("| fail | warn | error | skip | pass | objects |")
    out.append("|---:|---:|---:|---:|---:|---:|")
    out.append(f"| {tally['fail']} | {tally['warn']} | {tally['error']} | {tally['skip']} | {tally['pass']} | {audit.objects} |")
    out += ["", f"_{_md(summary_line(audit))}_", ""]
    if admin_access_line(audit):
        out += [_md(admin_access_line(audit)), ""]
    groups = grouped(selected(audit, all_results=all_results))
    if not groups:
        out += ["No findings.", ""]
    for namespace, items in groups.items():
        out.append(f"### {'Cluster (nodes)' if namespace == '' else f'Namespace `{_md(namespace)}`'}")
        out.append("")
        out.append("| Object | Policy | Result | Action | Severity | Message |")
        out.append("|---|---|---|---|---|---|")
        for item in items:
            out.append(
                f"| `{_md(_objects(item))}` | {item.policy} | {_ICON[model.Result(report.result_of(item))]} | {item.action.value} "
                f"| {item.severity.value} | {_md(item.message)} |"
            )
        out.append("")
    if inspection.table_nodes(audit.nodes):
        out += ["### GPU allocation", "", "```text", inspection.summary(audit.nodes).rstrip("\n"), "```", ""]
    return "\n".join(out)


# --- html -----------------------------------------------------------------------------------------

_CSS = """
:root { --fail:#c62828; --error:#6a1b9a; --warn:#ef6c00; --skip:#607d8b; --pass:#2e7d32; --ink:#1d2630;
        --muted:#5f6b7a; --line:#dde3ea; --bg:#f6f8fa; --bar:#1565c0; --over:#c62828; }
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 32px; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: var(--ink); background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 8px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 15px; margin: 18px 0 6px; }
.sub { color: var(--muted); margin: 0 0 16px; }
.cards { display: flex; gap: 12px; flex-wrap: wrap; }
.tile { min-width: 96px; padding: 10px 14px; border-radius: 8px; background: var(--bg); border-left: 5px solid var(--muted); }
.tile b { display: block; font-size: 22px; }
.tile.fail { border-color: var(--fail); } .tile.error { border-color: var(--error); }
.tile.warn { border-color: var(--warn); } .tile.skip { border-color: var(--skip); } .tile.pass { border-color: var(--pass); }
table { border-collapse: collapse; width: 100%; margin: 6px 0 12px; }
th, td { text-align: left; padding: 6px 8px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { background: var(--bg); font-weight: 600; }
td.msg { width: 55%; }
td.obj { white-space: nowrap; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; color: #fff; font-size: 12px; font-weight: 600; }
.badge.fail { background: var(--fail); } .badge.error { background: var(--error); } .badge.warn { background: var(--warn); }
.badge.skip { background: var(--skip); } .badge.pass { background: var(--pass); }
code { font: 12px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.node { margin: 10px 0 16px; }
.node .meta { color: var(--muted); font-size: 12px; }
.gpu { display: grid; grid-template-columns: 56px 1fr 210px; gap: 8px; align-items: center; margin: 4px 0; }
.track { height: 16px; background: #e9edf2; border-radius: 4px; overflow: hidden; }
.fill { height: 100%; background: var(--bar); }
.fill.over { background: var(--over); }
.num { font-variant-numeric: tabular-nums; color: var(--muted); }
.empty { color: var(--muted); font-style: italic; }
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _card_rows(node: inspection.NodeJson) -> list[str]:
    rows: list[str] = []
    for device in node["devs"]:
        used, total = device["usedGPU"], device["totalGPU"]
        over = used > total or sum(p["usedCore"] for p in device["pods"]) > gpu.MAX_CORE_PERCENTAGE
        percent = 100 if total <= 0 else min(100, round(100 * used / total))
        core = f", {device['usedCore']}% cores" if device["usedCore"] else ""
        whole = ", whole card" if device["whole"] else ""
        holders = ", ".join(f"{p['namespace']}/{p['name']}" for p in device["pods"]) or "idle"
        rows.append(
            f'<div class="gpu" title="{_e(holders)}"><code>GPU{device["id"]}</code>'
            f'<div class="track"><div class="fill{" over" if over else ""}" style="width:{percent}%"></div></div>'
            f'<span class="num">{used}/{total} GiB{_e(core + whole)}</span></div>'
        )
    if node["pending"]:
        pending = ", ".join(f"{p['namespace']}/{p['name']} ({p['usedGPU']} GiB)" for p in node["pending"])
        rows.append(f'<div class="meta">on no card of this node: {_e(pending)}</div>')
    return rows


def html_page(audit: scan.Audit, *, all_results: bool = False, title: str = "gpu-admission audit") -> str:
    """One self-contained HTML document: summary, findings per namespace, GPU allocation per node."""
    tally = report.counts(audit.findings)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        f'<p class="sub">{_e(summary_line(audit))}</p>',
        '<div class="cards">',
    ]
    for name in ("fail", "warn", "error", "skip", "pass"):
        parts.append(f'<div class="tile {name}"><b>{tally[name]}</b>{name}</div>')
    parts.append(f'<div class="tile"><b>{audit.objects}</b>objects</div></div>')

    parts.append("<h2>Findings</h2>")
    groups = grouped(selected(audit, all_results=all_results))
    if not groups:
        parts.append('<p class="empty">No findings.</p>')
    for namespace, items in groups.items():
        heading = "Cluster (nodes)" if namespace == "" else f"Namespace <code>{_e(namespace)}</code>"
        parts.append(f'<h3>{heading} <span class="num">({len(items)})</span></h3>')
        parts.append(
            "<table><thead><tr><th>Object</th><th>Policy</th><th>Result</th><th>Action</th>"
            "<th>Severity</th><th>Message</th></tr></thead><tbody>"
        )
        for item in items:
            parts.append(
                f'<tr><td class="obj"><code>{_e(_objects(item))}</code></td>'
                f"<td>{_e(item.policy)}<br>"
                f'<span class="num">{_e(item.rule)}</span></td>'
                f'<td><span class="badge {report.result_of(item)}">{report.result_of(item)}</span></td>'
                f"<td>{_e(item.action.value)}</td><td>{_e(item.severity.value)}</td>"
                f'<td class="msg">{_e(item.message)}</td></tr>'
            )
        parts.append("</tbody></table>")

    parts.append("<h2>GPU allocation</h2>")
    if not audit.nodes:
        parts.append('<p class="empty">No GPU node with shared or topology cards in this audit.</p>')
    for node in inspection.as_json(audit.nodes)["nodes"]:
        parts.append(
            f'<div class="node"><h3><code>{_e(node["name"])}</code></h3>'
            f'<div class="meta">mode {_e(node["mode"])}, placement {_e(node["placement"])}, '
            f"{len(node['devs'])} card(s), {node['usedGPU']}/{node['totalGPU']} GiB allocated, "
            f"{len({(p['namespace'], p['name']) for d in node['devs'] for p in d['pods']})} pod(s)</div>"
        )
        parts.extend(_card_rows(node))
        parts.append("</div>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def render(audit: scan.Audit, *, output: str, all_results: bool = False) -> str:
    """`table`, `markdown` or `html` (json and yaml are reports: see `report.as_list`)."""
    if output == "markdown":
        return markdown(audit, all_results=all_results)
    if output == "html":
        return html_page(audit, all_results=all_results)
    return table(audit, all_results=all_results)
