"""Filter, score and choose: which nodes can take a pod, how good each is, and which card(s) it gets.

Pure functions over `cards.NodeState`. The rules:
- A node never fits (`FailedAndUnresolvableNodes`; preemption cannot help) when the pod's request
  is malformed, the node's mode does not serve the pod's resource, the node has no cards, or no
  card (no set of cards) would hold the pod even if empty.
- A node fits only later (`FailedNodes`) when such a card exists but is occupied now.
- The pod's card-model constraint (`policies.gpu.cardmodel`: GPU102's annotations `gpu-model`,
  `exclude-gpu-model`, `min-gpu-memory`) holds per card: only the cards that meet it count, for the
  verdict, the card chosen and the refusal's reasons. A node without such a card, or whose such cards
  are all too small (or too few, for whole cards), never fits (`CARD_MODEL`), even where its other
  cards would hold the pod.
- Inside a node, `ack.node.gpu.placement` decides: `binpack` (default) takes the fitting card that
  is left with the least free memory (then the fewest free cores, then the lowest index), `spread`
  the one with the most free memory (then the lowest index). Whole-card pods get the
  best-connected free set (`topology.best_set`).
- Scores (0-10): binpack nodes score by how full they are after placing the pod (prefer busy
  nodes), spread nodes by how empty; whole-card pods by set connectivity and fullness.

Every refusal is a `reasons.Reason` (a stable code and a sentence): the filter joins the sentences
for kube-scheduler, and `gpu-admission explain` / `simulate` show the codes, so the rules live here
once. `diagnose` adds what only a counterfactual shows: that the pod would fit without the
reservations of binds in flight, or without the allocations of pods that are gone.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import itertools
from collections.abc import Iterable, Mapping, Sequence

from policies import gpu
from policies.gpu import cardmodel, cardrequest, cards, inventory, reasons
from webhook.extender import topology, wire

ReasonCode = reasons.Code  # the field `reasons` hides the module inside the dataclasses below


class Verdict(enum.StrEnum):
    FITS = "fits"
    FULL = "full"  # fits once something leaves: FailedNodes
    NEVER = "never"  # FailedAndUnresolvableNodes


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fit:
    """The verdict for one node, the card(s) the pod would get, and the node's score."""

    verdict: Verdict
    reasons: tuple[reasons.Reason, ...] = ()
    cards: tuple[int, ...] = ()
    score: int = 0

    @property
    def fits(self) -> bool:
        return self.verdict is Verdict.FITS

    @property
    def message(self) -> str:
        return reasons.join(self.reasons)

    @property
    def codes(self) -> tuple[ReasonCode, ...]:
        return tuple(reason.code for reason in self.reasons)


def _refuse(verdict: Verdict, code: reasons.Code, message: str) -> Fit:
    return Fit(verdict=verdict, reasons=(reasons.Reason(code=code, message=message),))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
    """A filter answer before it goes on the wire."""

    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]
    reasons: dict[str, tuple[reasons.Reason, ...]] = dataclasses.field(default_factory=dict)  # failed and unresolvable


def evaluate(request: cardrequest.Request, state: cards.NodeState, *, decide: bool = True, explain: bool = True) -> Fit:
    """Whether and where `request` fits on the node, with the node's score. With `decide` off only
    the verdict is computed (filter needs no card and no score; it judges hundreds of nodes); with
    `explain` off a refusal comes without its reasons (prioritize and simulate need the verdict only)."""
    node = state.node
    if request.problem:
        return _refuse(Verdict.NEVER, reasons.Code.BAD_REQUEST, request.problem)
    family = request.family
    if family is None:
        return Fit(verdict=Verdict.FITS, score=0)  # nothing for us to place; not our business
    if node.mode not in gpu.modes_for(family):
        return _mode_mismatch(node.mode_label, family)
    if not node.cards:
        return _refuse(Verdict.NEVER, reasons.Code.NO_GPU, f"node has no GPU cards: {node.problem}")
    allowed: tuple[int, ...] | None = None  # positions (in node.cards) of the cards the constraint allows; None: all
    if not request.card.any:
        allowed = _allowed(request.card, node.cards)
        if not allowed:
            if not explain:
                return _NEVER
            return _refuse(
                Verdict.NEVER,
                reasons.Code.CARD_MODEL,
                f"no GPU card meets the pod's card-model constraint, {request.card.describe()}: the node has "
                f"{_cards_shown(node.cards)}",
            )
    if family is gpu.Family.TOPOLOGY:
        return _evaluate_whole(request, state, decide=decide, explain=explain, allowed=allowed)
    return _evaluate_shared(request, state, decide=decide, explain=explain, allowed=allowed)


def _allowed(constraint: cardmodel.Constraint, node_cards: tuple[inventory.Card, ...]) -> tuple[int, ...]:
    # Not cached: hashing the cards costs more than judging them (a few comparisons per card).
    allows = constraint.allows
    return tuple([i for i, card in enumerate(node_cards) if allows(model=card.model, memory_mib=card.memory_mib)])


@functools.lru_cache(maxsize=1024)  # a refusal names the cards on every node; nodes share few card lists
def _cards_shown(node_cards: tuple[inventory.Card, ...]) -> str:
    """The node's cards by model and memory: `GPU0, GPU1 Tesla-V100-SXM2-16GB with 16160 MiB; ...`."""
    groups: dict[tuple[str, int], list[int]] = {}
    for card in node_cards:
        groups.setdefault((card.model, card.memory_mib), []).append(card.index)
    return "; ".join(
        f"{', '.join(f'GPU{i}' for i in indices)} "
        f"{model or f'of unknown model (no {gpu.INVENTORY_ANNOTATION} annotation)'} with {mib} MiB"
        for (model, mib), indices in groups.items()
    )


def _only(request: cardrequest.Request, state: cards.NodeState, allowed: tuple[int, ...] | None) -> str:
    """What a refusal among the constrained cards adds: which cards the constraint leaves."""
    if allowed is None:
        return ""
    shown = ", ".join(f"GPU{state.cards[i].index}" for i in allowed)
    return f" (only {shown} meet the pod's card-model constraint, {request.card.describe()})"


@functools.lru_cache(maxsize=256)  # few (label, family) pairs; filter meets them on most nodes
def _mode_mismatch(mode_label: str, family: gpu.Family) -> Fit:
    shown = mode_label or f"{gpu.Mode.DEFAULT} (no label)"
    serving = gpu.modes_for(family)
    return _refuse(
        Verdict.NEVER,
        reasons.Code.MODE_MISMATCH,
        f'node is in GPU mode "{shown}" ({gpu.SCHEDULE_LABEL}); {_family_text(family)} is served by {", ".join(serving)}',
    )


def choose(request: cardrequest.Request, state: cards.NodeState) -> tuple[int, ...] | None:
    """The card(s) bind gives the pod on this node, or None where it does not fit now."""
    fit = evaluate(request, state)
    return fit.cards if fit.fits and fit.cards else None


def filter_nodes(request: cardrequest.Request, *, states: Mapping[str, cards.NodeState | None], names: Iterable[str]) -> Outcome:
    """Classify every candidate; a node the extender does not know yet fails for now, not forever."""
    return classify(
        {name: None if (state := states.get(name)) is None else evaluate(request, state, decide=False) for name in names}, names
    )


def classify(fits: Mapping[str, Fit | None], names: Iterable[str]) -> Outcome:
    """`filter_nodes` on verdicts already made (`evaluate` with `decide` off; None: the node is not known)."""
    names = names if isinstance(names, (tuple, list)) else tuple(names)
    get, fitting = fits.get, Verdict.FITS
    # Most candidates fit: one C-speed pass finds them, the refusals (in the order sent) a second.
    passed = [name for name in names if (fit := get(name)) is not None and fit.verdict is fitting]
    outcome = Outcome(passed=passed, failed={}, unresolvable={})
    if len(passed) == len(names):
        return outcome
    for name in names:
        fit = get(name) or _NOT_CACHED
        if fit.verdict is fitting:
            continue
        (outcome.failed if fit.verdict is Verdict.FULL else outcome.unresolvable)[name] = fit.message
        outcome.reasons[name] = fit.reasons
    return outcome


def classify_in_order(fits: Sequence[Fit | None], names: Sequence[str]) -> Outcome:
    """`classify` with the verdicts in the order of `names` (`Store.judged_list`): one pass, no
    lookup by name (a filter at 5,000 nodes, issue 19); the same answer."""
    fitting = Verdict.FITS
    outcome = Outcome(passed=[], failed={}, unresolvable={})
    passed, failed, unresolvable, found = outcome.passed.append, outcome.failed, outcome.unresolvable, outcome.reasons
    for name, fit in zip(names, fits, strict=True):
        if fit is not None and fit.verdict is fitting:
            passed(name)
            continue
        fit = fit or _NOT_CACHED
        (failed if fit.verdict is Verdict.FULL else unresolvable)[name] = fit.message
        found[name] = fit.reasons
    return outcome


def diagnose(request: cardrequest.Request, state: cards.NodeState, *, stale: frozenset[str] = frozenset()) -> Fit:
    """`evaluate`, and where the pod does not fit now, whether it would without the reservations
    of binds in flight (`RESERVED_IN_FLIGHT`) or without the allocations of the pod UIDs in `stale`
    (pods that are gone: `STALE_ALLOCATION`). Those reasons come first: they say what to wait for
    or clean up; the capacity reason after them says what is short meanwhile."""
    fit = evaluate(request, state)
    if fit.verdict is not Verdict.FULL:
        return fit
    extra: list[reasons.Reason] = []
    gone = [a for a in state.allocations if a.uid in stale]
    if gone and evaluate(request, _without(state, {a.uid for a in gone})).fits:
        shown = ", ".join(f"{a.pod_key} (card {','.join(map(str, a.cards))})" for a in gone[:5])
        extra.append(
            reasons.Reason(
                code=reasons.Code.STALE_ALLOCATION,
                message=f"cards are held by {len(gone)} allocation(s) of pods that no longer exist: {shown}",
            )
        )
    flying = [a for a in state.allocations if not a.bound and a.uid not in stale]
    if flying and evaluate(request, _without(state, {a.uid for a in (*gone, *flying)})).fits:
        shown = ", ".join(f"{a.pod_key} (card {','.join(map(str, a.cards))})" for a in flying[:5])
        extra.append(
            reasons.Reason(
                code=reasons.Code.RESERVED_IN_FLIGHT,
                message=f"cards are reserved by {len(flying)} bind(s) in flight, released when they complete or expire: {shown}",
            )
        )
    return dataclasses.replace(fit, reasons=(*extra, *fit.reasons)) if extra else fit


def _without(state: cards.NodeState, uids: set[str]) -> cards.NodeState:
    return cards.occupy(state.node, [a for a in state.allocations if a.uid not in uids])


def scores(request: cardrequest.Request, *, states: Mapping[str, cards.NodeState | None], names: Iterable[str]) -> dict[str, int]:
    """Prioritize: 0-10 per node (0 where the pod does not fit)."""
    return {name: 0 if (state := states.get(name)) is None else score(request, state) for name in names}


def score(request: cardrequest.Request, state: cards.NodeState) -> int:
    """Prioritize's 0-10 for one node (0 where the pod does not fit)."""
    if not evaluate(request, state, decide=False, explain=False).fits:
        return 0
    if request.family is gpu.Family.TOPOLOGY:
        return evaluate(request, state).score  # the score depends on the set chosen
    return _shared_score(request, state)  # no need to pick the card


_FITS = Fit(verdict=Verdict.FITS)
_FULL = Fit(verdict=Verdict.FULL)  # refusals without reasons, for callers that asked for none
_NEVER = Fit(verdict=Verdict.NEVER)
_NOT_CACHED = _refuse(Verdict.FULL, reasons.Code.NOT_CACHED, "node is not in the GPU extender's cache yet")


def _evaluate_shared(
    request: cardrequest.Request, state: cards.NodeState, *, decide: bool, explain: bool, allowed: tuple[int, ...] | None
) -> Fit:
    memory, core = request.memory_gib, request.core_percent
    if state.largest_card_gib < memory:
        if not explain:
            return _NEVER
        largest = max(state.cards, key=lambda c: (c.card.memory_gib, -c.index))
        return _refuse(
            Verdict.NEVER,
            reasons.Code.INSUFFICIENT_MEMORY,
            f"no GPU card is large enough: the pod needs {request.describe()}; the largest card is "
            f"GPU{largest.index} with {largest.card.memory_gib} GiB",
        )
    candidates, free = state.cards, state.free  # (GiB, core %) per card, computed once per state
    if allowed is not None:
        candidates = tuple([candidates[i] for i in allowed])
        free = tuple([free[i] for i in allowed])
    if not decide and any(free_memory >= memory and free_core >= core for free_memory, free_core in free):
        return _FITS  # the common filter case, kept cheap: hundreds of nodes per pod
    if allowed is not None:  # a card with the free memory is large enough: only now can it be too small
        largest = max(candidates, key=lambda c: (c.card.memory_gib, -c.index))
        if largest.card.memory_gib < memory:
            if not explain:
                return _NEVER
            return _refuse(
                Verdict.NEVER,
                reasons.Code.CARD_MODEL,
                f"no GPU card that meets the pod's card-model constraint is large enough: the pod needs "
                f"{request.describe()}, and {request.card.describe()}; the largest such card is GPU{largest.index} "
                f"with {largest.card.memory_gib} GiB (the node has {_cards_shown(state.node.cards)})",
            )
    fitting = [
        c for c, (m, k) in zip(candidates, free, strict=True) if m >= memory and k >= core
    ]  # whole-used and DRA cards have 0 free
    if not fitting:
        if not explain:
            return _FULL
        short = _short(request, candidates, free)
        return dataclasses.replace(
            short,
            reasons=(
                *_dra_reasons([c for c in candidates if c.card.memory_gib >= memory]),
                *(dataclasses.replace(r, message=r.message + _only(request, state, allowed)) for r in short.reasons),
            ),
        )
    if state.node.placement is gpu.Placement.SPREAD:
        chosen = min(fitting, key=lambda c: (-c.memory_free, -c.core_free, c.index))
    else:
        chosen = min(fitting, key=lambda c: (c.memory_free - memory, c.core_free - core, c.index))
    return Fit(verdict=Verdict.FITS, cards=(chosen.index,), score=_shared_score(request, state))


def _dra_reasons(candidates: Iterable[cards.CardState]) -> tuple[reasons.Reason, ...]:
    """`DRA_ALLOCATED` where some of the cards that could hold the pod are allocated to DRA claims."""
    held = [c for c in candidates if c.dra]
    if not held:
        return ()
    shown = "; ".join(f"GPU{c.index} ({c.card.uuid}) to " + ", ".join(h.describe() for h in c.dra[:3]) for c in held[:5])
    return (
        reasons.Reason(
            code=reasons.Code.DRA_ALLOCATED,
            message=f"{len(held)} card(s) that could hold the pod are allocated by Dynamic Resource Allocation, "
            f"offered again once released: {shown}",
        ),
    )


def _short(request: cardrequest.Request, candidates: tuple[cards.CardState, ...], free: tuple[tuple[int, int], ...]) -> Fit:
    """Why none of the candidate cards holds the pod now: cores, fragmentation or memory (from their free tuples)."""
    memory, core = request.memory_gib, request.core_percent
    best = max(range(len(free)), key=lambda i: (free[i][0], free[i][1], -candidates[i].index))
    total_free = sum(m for m, k in free if k >= core)
    if any(m >= memory for m, _ in free):
        code = reasons.Code.CORE_EXHAUSTED  # the memory is there; the cores are not
    elif total_free >= memory:
        largest = max((i for i in range(len(free)) if free[i][1] >= core), key=lambda i: (free[i][0], -candidates[i].index))
        return _refuse(
            Verdict.FULL,
            reasons.Code.FRAGMENTED,
            f"insufficient GPU memory on any single card (fragmented): the pod needs {request.describe()}; the node has "
            f"{total_free} GiB free in total, but the largest free block is {free[largest][0]} GiB "
            f"(GPU{candidates[largest].index}; free per card: "
            + ", ".join(f"GPU{c.index} {m}" for c, (m, _) in zip(candidates, free, strict=True))
            + ")",
        )
    else:
        code = reasons.Code.INSUFFICIENT_MEMORY
    card = candidates[best]
    cores = f" and {free[best][1]}% cores" if core else ""
    return _refuse(
        Verdict.FULL,
        code,
        f"insufficient GPU {'memory or cores' if core else 'memory'} on any single card: the pod needs "
        f"{request.describe()}; the card with the most free memory is GPU{card.index} with "
        f"{free[best][0]} GiB{cores} free of {card.card.memory_gib} GiB",
    )


def _shared_score(request: cardrequest.Request, state: cards.NodeState) -> int:
    """Binpack nodes score by how full they are once the pod is on them; spread nodes by how empty."""
    fullness = min(1.0, (state.memory_used + request.memory_gib) / (state.memory_total or 1))
    fraction = fullness if state.node.placement is gpu.Placement.BINPACK else 1.0 - fullness
    return round(wire.MAX_PRIORITY * fraction)


def _evaluate_whole(
    request: cardrequest.Request, state: cards.NodeState, *, decide: bool, explain: bool, allowed: tuple[int, ...] | None
) -> Fit:
    wanted = request.cards
    total = len(state.cards)
    if wanted > total:
        if not explain:
            return _NEVER
        return _refuse(
            Verdict.NEVER, reasons.Code.NO_TOPOLOGY_SET, f"the pod needs {request.describe()}; the node has {total} cards"
        )
    if allowed is not None and wanted > len(allowed):
        if not explain:
            return _NEVER
        return _refuse(
            Verdict.NEVER,
            reasons.Code.CARD_MODEL,
            f"the pod needs {request.describe()} that meet its card-model constraint, {request.card.describe()}; "
            f"{len(allowed)} of the node's cards do (the node has {_cards_shown(state.node.cards)})",
        )
    if allowed is None and not decide and state.idle_cards >= wanted:
        return _FITS
    considered = state.cards if allowed is None else [state.cards[i] for i in allowed]
    free = [c.index for c in considered if c.idle]
    if len(free) < wanted:
        if not explain:
            return _FULL
        shown = ", ".join(f"GPU{i}" for i in free) or "none"
        refused = _refuse(
            Verdict.FULL,
            reasons.Code.NO_TOPOLOGY_SET,
            f"insufficient whole GPUs: the pod needs {request.describe()}; {len(free)} of "
            f"{total if allowed is None else len(allowed)} cards are free ({shown})" + _only(request, state, allowed),
        )
        return dataclasses.replace(refused, reasons=(*_dra_reasons(considered), *refused.reasons))
    if not decide:
        return _FITS
    chosen = topology.best_set(free, wanted, state.node.links)
    assert chosen is not None  # len(free) >= wanted > 0
    fullness = (total - len(free) + wanted) / total
    quality = _quality(chosen, state.node.links, [c.index for c in state.cards])
    return Fit(verdict=Verdict.FITS, cards=chosen, score=round(wire.MAX_PRIORITY * (quality + fullness) / 2))


def _quality(chosen: tuple[int, ...], links: inventory.Topology, every: list[int]) -> float:
    """How well the chosen set is connected relative to the node's best link (1.0 without topology)."""
    if len(chosen) < 2 or not links.known:
        return 1.0
    best = max((links.score(a, b) for a, b in itertools.combinations(every, 2)), default=0)
    pairs = len(chosen) * (len(chosen) - 1) // 2
    return topology.set_score(chosen, links) / (best * pairs) if best else 1.0


def _family_text(family: gpu.Family) -> str:
    return {
        gpu.Family.SHARED: f"{gpu.Resource.GPU_MEM}",
        gpu.Family.SHARED_CORE: f"{gpu.Resource.GPU_MEM} with {gpu.Resource.GPU_CORE_PERCENTAGE}",
        gpu.Family.TOPOLOGY: f"{gpu.Resource.ALIYUN_GPU}",
        gpu.Family.EXCLUSIVE: f"{gpu.Resource.NVIDIA_GPU}",
    }[family]
