"""`explain`'s output: the JSON contract (also YAML) and the table for people.

JSON (stable; README "explain"):

    {"pod": "ns/name",
     "admission": {"allowed": true, "violations": [{"policy", "action", "message"}], "warnings": [...]} | null,
     "request": {"family", "memoryGiB", "corePercent", "cards", "modes": [...], "selectors": [...], "problem"},
     "bound": {"node", "cards": [...], "memoryGiB", "corePercent"} | null,
     "nodes": [{"node", "fits", "reasons": [{"code", "message"}], "cards": [...], "chosen": [...]}],
     "suggestion": {"node", "change", "moves": [...]} | null,
     "budget": {"namespace", "state", "budget", "memoryMiB", "cards", "usedMiB", "usedCards", "askedMiB",
                "askedCards", "reason": {"code", "message"} | null, "nodes": [...], "why"}}

`budget` is there only where the pod was judged against its namespace's GPU budget (a Pending GPU
pod, `webhook.explain.budget`): `state` unlimited, fits, charged (its charge is in the namespace's
ledger already), over (`reason` NAMESPACE_BUDGET where it refuses the pod everywhere, `nodes` the
nodes it refuses) or unknown (`why`: no settings file, namespace labels not readable).

`cards` of a node: `{"index", "model", "memoryGiB", "usedGiB", "freeGiB", "coreUsed", "whole", "pods"}`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NotRequired, TypedDict

import yaml

from policies import gpu
from policies.gpu import cards, reasons
from webhook.explain import analysis, budget

MAX_NODES_SHOWN = 10


class ReasonJson(TypedDict):
    code: str
    message: str


class CardJson(TypedDict):
    index: int
    model: str
    memoryGiB: int
    usedGiB: int
    freeGiB: int
    coreUsed: int
    whole: bool
    pods: list[str]


class PreemptionJson(TypedDict):
    cards: list[int]
    victims: list[str]
    pdbViolations: int


class NodeJson(TypedDict):
    node: str
    fits: bool
    reasons: list[ReasonJson]
    cards: list[CardJson]
    chosen: list[int]
    preemption: PreemptionJson | None


class RequestJson(TypedDict):
    family: str
    memoryGiB: int
    corePercent: int
    cards: int
    modes: list[str]
    selectors: list[str]
    problem: str


class HoldJson(TypedDict):
    node: str
    pod: str
    priority: int
    victims: list[str]
    recordedAt: float
    standing: bool
    cards: list[int]


def holds_json(notes: Sequence[analysis.HoldNote]) -> list[HoldJson]:
    """The hold records as explain's and simulate's JSON list them (`holds`, present only where any is)."""
    return [
        {
            "node": h.node,
            "pod": h.pod,
            "priority": h.priority,
            "victims": list(h.victims),
            "recordedAt": h.at,
            "standing": h.standing,
            "cards": list(h.cards),
        }
        for h in notes
    ]


def holds_lines(notes: Sequence[analysis.HoldNote], *, now: float) -> list[str]:
    """ "Holds:" and a line per record; none where there is none."""
    return (
        [
            "Holds:      preemption hold records (kept for their preemptor against pods of its priority or below):",
            *(f"  {h.describe(now=now)}" for h in notes),
        ]
        if notes
        else []
    )


class ReportJson(TypedDict):
    pod: str
    admission: dict[str, Any] | None
    request: RequestJson
    bound: dict[str, Any] | None
    nodes: list[NodeJson]
    suggestion: dict[str, Any] | None
    scheduler: NotRequired[str]  # only in front of another GPU scheduler (its profile's notice)
    budget: NotRequired[dict[str, Any]]  # only where the pod was judged against a namespace budget


def card_json(card: cards.CardState) -> CardJson:
    return {
        "index": card.index,
        "model": card.card.model,
        "memoryGiB": card.card.memory_gib,
        "usedGiB": card.card.memory_gib if card.whole_used else min(card.memory_used, card.card.memory_gib),
        "freeGiB": card.memory_free,
        "coreUsed": min(card.core_used, gpu.MAX_CORE_PERCENTAGE),
        "whole": card.whole_used,
        "pods": [a.pod_key for a in card.allocations],
    }


def reason_json(reason: reasons.Reason) -> ReasonJson:
    return {"code": str(reason.code), "message": reason.message}


def as_json(report: analysis.Report) -> ReportJson:
    found = _as_json(report)
    if report.scheduler:
        found["scheduler"] = report.scheduler
    if report.budget is not None:
        found["budget"] = budget_json(report.budget)
    return found


def budget_json(note: budget.BudgetNote) -> dict[str, Any]:
    limit = note.budget
    return {
        "namespace": note.namespace,
        "state": note.state,
        "budget": limit.name if limit is not None else None,
        "memoryMiB": limit.memory_mib if limit is not None else None,
        "cards": limit.cards if limit is not None else None,
        "usedMiB": note.used.memory_mib,
        "usedCards": note.used.cards,
        "askedMiB": note.asked.memory_mib,
        "askedCards": note.asked.cards,
        "reason": reason_json(note.reason) if note.reason is not None else None,
        "nodes": sorted(note.per_node),
        "why": note.why,
    }


def _as_json(report: analysis.Report) -> ReportJson:
    admission = report.admission
    request = report.request
    return {
        "pod": report.pod,
        "admission": None
        if admission is None
        else {
            "allowed": admission.allowed,
            "violations": [{"policy": v.policy, "action": str(v.action), "message": v.message} for v in admission.violations],
            "warnings": list(admission.warnings),
        },
        "request": {
            "family": report.family,
            "memoryGiB": request.memory_gib,
            "corePercent": request.core_percent,
            "cards": request.cards,
            "modes": list(report.modes),
            "selectors": list(report.selectors),
            "problem": request.problem,
        },
        "bound": None
        if report.bound is None
        else {
            "node": report.bound.node,
            "cards": list(report.bound.cards),
            "memoryGiB": report.bound.memory_gib,
            "corePercent": report.bound.core_percent,
        },
        "nodes": [
            {
                "node": v.node,
                "fits": v.fits,
                "reasons": [reason_json(r) for r in v.reasons],
                "cards": [card_json(c) for c in (v.state.cards if v.state is not None else ())],
                "chosen": list(v.cards),
                "preemption": None
                if v.preemption is None
                else {
                    "cards": list(v.preemption.cards),
                    "victims": [p.key for p in v.preemption.victims],
                    "pdbViolations": v.preemption.violations,
                },
            }
            for v in report.nodes
        ],
        "suggestion": None
        if report.suggestion is None
        else {"node": report.suggestion.node, "change": report.suggestion.change, "moves": list(report.suggestion.moves)},
    }


def _with_holds(report: analysis.Report) -> dict[str, Any]:
    document: dict[str, Any] = dict(as_json(report))
    if report.holds:
        document["holds"] = holds_json(report.holds)
    return document


def render(report: analysis.Report, *, output: str, now: float = 0.0) -> str:
    if output == "json":
        return json.dumps(_with_holds(report), indent=2) + "\n"
    if output == "yaml":
        return yaml.safe_dump(_with_holds(report), sort_keys=False)
    return table(report, now=now)


def table(report: analysis.Report, *, now: float = 0.0) -> str:
    lines = [f"Pod:        {report.pod}"]
    if report.scheduler:
        lines.append(f"Scheduler:  {report.scheduler}")
    lines.append(f"Admission:  {_admission(report)}")
    lines.append(f"Request:    {_request(report)}")
    if report.modes:
        lines.append(f"Modes:      {', '.join(report.modes)}")
    lines.append(f"Selectors:  {'; '.join(report.selectors) if report.selectors else 'none'}")
    if report.budget is not None:
        lines.append(f"Budget:     {report.budget.describe()}")
    if report.bound is not None:
        where = ", ".join(f"GPU{i}" for i in report.bound.cards) or "no card recorded (no allocation annotation)"
        lines.append(f"Bound:      node {report.bound.node}, {where}")
        return "\n".join(lines) + "\n"
    if not report.managed:
        lines.append("Per node:   the pod asks for no GPU the extender places; nothing to explain")
        return "\n".join(lines) + "\n"
    lines.append("Per node:")
    lines.extend(grouped(report.nodes))
    if not any(v.fits for v in report.nodes):
        lines.extend(_preemption(report.nodes))
    lines.extend(holds_lines(report.holds, now=now))
    suggestion = report.suggestion
    if any(v.fits for v in report.nodes):
        fitting = [v for v in report.nodes if v.fits]
        lines.append(
            f"Best node:  {fitting[0].node} fits now"
            + (f" (GPU{','.join(map(str, fitting[0].cards))})" if fitting[0].cards else "")
        )
    elif report.budget is not None and report.budget.reason is not None:
        lines.append("Best node:  none until the namespace's budget has room for the pod (NAMESPACE_BUDGET)")
    elif suggestion is not None:
        lines.append(f"Best node:  {suggestion.node}: {suggestion.change}")
    else:
        lines.append("Best node:  none: no GPU node can take this pod by changing its occupation")
    return "\n".join(lines) + "\n"


def _preemption(verdicts: Sequence[analysis.NodeVerdict]) -> list[str]:
    """What the extender's preempt verb would answer (issue 27): the victims per node, or why not."""
    able = [v for v in verdicts if v.preemption is not None]
    if able:
        lines = ["Preemption: would make the pod fit by evicting (kube-scheduler picks the node):"]
        for verdict in able[:MAX_NODES_SHOWN]:
            choice = verdict.preemption
            assert choice is not None  # filtered above
            victims = ", ".join(f"{p.key} (priority {p.priority})" for p in choice.victims)
            lines.append(f"  {verdict.node} GPU{','.join(map(str, choice.cards))}: {victims}")
        return lines
    if any(v.codes and v.codes[-1] is reasons.Code.PREEMPTION_IMPOSSIBLE for v in verdicts):
        return ["Preemption: impossible: no full node has pods of lower priority that free a card (PREEMPTION_IMPOSSIBLE)"]
    return []


def grouped(verdicts: Sequence[analysis.NodeVerdict]) -> list[str]:
    """Nodes grouped by reason code (a node under each of its codes), fitting nodes last."""
    groups: dict[str, dict[str, list[str]]] = {}  # code -> node -> sentences (a node once per code)
    for verdict in verdicts:
        if verdict.fits:
            groups.setdefault("FITS", {})[verdict.node] = [
                "fits" + (f" on GPU{','.join(map(str, verdict.cards))}" if verdict.cards else "")
            ]
        for reason in verdict.reasons:
            groups.setdefault(str(reason.code), {}).setdefault(verdict.node, []).append(reason.message)
    lines: list[str] = []
    if not groups:
        return ["  no GPU node in the cluster"]
    for code in sorted(groups, key=lambda c: (c == "FITS", c)):
        members = [(name, "; ".join(messages)) for name, messages in groups[code].items()]
        names = [n for n, _ in members]
        shown = ", ".join(names[:MAX_NODES_SHOWN]) + (
            f" and {len(names) - MAX_NODES_SHOWN} more" if len(names) > MAX_NODES_SHOWN else ""
        )
        lines.append(f"  {code} ({len(names)} node{'s' if len(names) != 1 else ''}): {shown}")
        for name, message in members[:MAX_NODES_SHOWN]:
            lines.append(f"    {name}: {message}")
    return lines


def _admission(report: analysis.Report) -> str:
    decision = report.admission
    if decision is None:
        return "not evaluated"
    if not decision.violations:
        return "allowed, no policy violated"
    shown = "; ".join(v.message for v in decision.violations)
    return f"{'allowed' if decision.allowed else 'DENIED'}: {shown}"


def _request(report: analysis.Report) -> str:
    request = report.request
    if request.problem:
        return f"malformed: {request.problem}"
    if request.family is not None:
        return request.describe()
    if report.family:
        return f"{report.family}: placed by kube-scheduler and the device plugin, not by the GPU extender"
    return "no GPU"
